/* gepard-error.h: GError domains of gepard-core, one per module. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* Errors from reading or writing model files: safetensors, configs, .nemo. */
#define GEPARD_FORMAT_ERROR (gepard_format_error_quark ())
GQuark gepard_format_error_quark (void);

typedef enum
{
  GEPARD_FORMAT_ERROR_IO,          /* the file cannot be opened, read, mapped or written */
  GEPARD_FORMAT_ERROR_CORRUPT,     /* the bytes do not follow the format */
  GEPARD_FORMAT_ERROR_UNSUPPORTED, /* a valid file using something Gepard does not read */
  GEPARD_FORMAT_ERROR_MISSING,     /* a file or tensor the model needs is absent */
  GEPARD_FORMAT_ERROR_SHAPE,       /* a tensor or config value has the wrong shape or type */
} GepardFormatError;

/* Errors from resolving a model name to a directory. */
#define GEPARD_HUB_ERROR (gepard_hub_error_quark ())
GQuark gepard_hub_error_quark (void);

typedef enum
{
  GEPARD_HUB_ERROR_NOT_FOUND,    /* neither a directory nor in the local cache */
  GEPARD_HUB_ERROR_INVALID_NAME, /* not a path and not an owner/name repo id */
} GepardHubError;

/* Errors from the tokenizer. */
#define GEPARD_TOKENIZER_ERROR (gepard_tokenizer_error_quark ())
GQuark gepard_tokenizer_error_quark (void);

typedef enum
{
  GEPARD_TOKENIZER_ERROR_INVALID,       /* tokenizer.json is malformed */
  GEPARD_TOKENIZER_ERROR_UNSUPPORTED,   /* a tokenizer.json feature Gepard does not implement */
  GEPARD_TOKENIZER_ERROR_UNKNOWN_TOKEN, /* a byte has no token in the vocabulary */
} GepardTokenizerError;

/* Errors from selecting and starting a compute backend. */
#define GEPARD_BACKEND_ERROR (gepard_backend_error_quark ())
GQuark gepard_backend_error_quark (void);

typedef enum
{
  GEPARD_BACKEND_ERROR_UNAVAILABLE, /* not built, no driver, or no device */
  GEPARD_BACKEND_ERROR_INVALID,     /* an unknown backend or device name */
} GepardBackendError;

G_END_DECLS
