#include "gepard-error.h"

G_DEFINE_QUARK (gepard - format - error - quark, gepard_format_error)
G_DEFINE_QUARK (gepard - hub - error - quark, gepard_hub_error)
G_DEFINE_QUARK (gepard - tokenizer - error - quark, gepard_tokenizer_error)
G_DEFINE_QUARK (gepard - backend - error - quark, gepard_backend_error)
