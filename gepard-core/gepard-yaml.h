/* gepard-yaml.h: the subset of YAML that NeMo's model_config.yaml is written in.
 *
 * model_config.yaml is an OmegaConf dump (PyYAML, block style): block mappings by indentation,
 * block sequences ("- ", also at the indentation of their key), flow lists and maps, plain and
 * quoted scalars, comments, literal/folded block scalars. Anchors, aliases, tags and complex keys
 * ("? ") are refused with GEPARD_FORMAT_ERROR_UNSUPPORTED; anything malformed is
 * GEPARD_FORMAT_ERROR_CORRUPT naming the line. Scalars are kept as text and typed by whoever reads
 * them, as OmegaConf's consumers do. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

typedef enum
{
  GEPARD_YAML_SCALAR,
  GEPARD_YAML_MAPPING,
  GEPARD_YAML_SEQUENCE,
} GepardYamlKind;

typedef struct _GepardYamlNode GepardYamlNode;

struct _GepardYamlNode
{
  GepardYamlKind kind;
  int line;         /* 1-based line where the node starts */
  char *scalar;     /* SCALAR: the text with quotes and escapes resolved */
  gboolean quoted;  /* SCALAR: quoted or a block scalar, so always a string */
  GPtrArray *keys;  /* MAPPING: char *, in file order, no duplicates */
  GPtrArray *items; /* MAPPING: the values, parallel to keys; SEQUENCE: the items */
};

/* Parses `len` bytes of UTF-8 text (no NUL bytes). An empty document gives an empty mapping. */
GepardYamlNode *gepard_yaml_parse (const char *text, gsize len, GError **error);
void gepard_yaml_node_free (GepardYamlNode *node);

/* The value of `key` in a MAPPING, or NULL (also when `node` is not a mapping). */
const GepardYamlNode *gepard_yaml_mapping_lookup (const GepardYamlNode *node, const char *key);

/* A plain scalar that YAML resolves to null: empty, "~" or null/Null/NULL. */
gboolean gepard_yaml_node_is_null (const GepardYamlNode *node);
/* A plain scalar in decimal integer form, within [min, max]. */
gboolean gepard_yaml_node_get_int (const GepardYamlNode *node, gint64 min, gint64 max,
                                   gint64 *value);
/* A plain scalar in decimal or exponent form (YAML 1.1 / 1.2 floats, no .inf or .nan). */
gboolean gepard_yaml_node_get_double (const GepardYamlNode *node, double *value);
/* A plain true/True/TRUE/false/False/FALSE. */
gboolean gepard_yaml_node_get_bool (const GepardYamlNode *node, gboolean *value);
/* Any non-null scalar, quoted or plain. */
const char *gepard_yaml_node_get_string (const GepardYamlNode *node);

G_DEFINE_AUTOPTR_CLEANUP_FUNC (GepardYamlNode, gepard_yaml_node_free)

G_END_DECLS
