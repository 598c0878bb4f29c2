/* gepard-pickle.c: a pickle machine for torch.save state dicts, and nothing more.
 *
 * Values live in one pool owned by the machine and are freed together, so the memo and the stack
 * can share them without reference counts, and nothing is ever freed recursively. Every opcode
 * reads its operand only after checking it lies inside the input; every value an opcode builds
 * costs at least one input byte, so memory stays proportional to the input. */
#include "gepard-pickle.h"

#include "gepard-error.h"

#include <stdarg.h>
#include <string.h>

/* The state dict of the published codec needs a stack of about two thousand values (items are
 * batched by a thousand) and a nesting of four marks. */
#define MAX_STACK (1u << 20)
#define MAX_MARKS 256u
/* values built and memo entries: the published state dict needs about 30 000 of each; the caps
 * bound memory for a hostile pickle to a few hundred megabytes */
#define MAX_VALUES (1u << 21)
#define MAX_MEMO (1u << 21)
#define MAX_GLOBAL_LEN 256u
/* LONG1 / LONG4 integers wider than this are refused: no state dict needs them */
#define MAX_LONG_BYTES 8u

typedef enum
{
  VALUE_NONE,
  VALUE_BOOL,
  VALUE_INT,
  VALUE_FLOAT,
  VALUE_STRING,
  VALUE_BYTES,
  VALUE_TUPLE,
  VALUE_LIST,
  VALUE_DICT,
  VALUE_GLOBAL,
  VALUE_STORAGE,
  VALUE_TENSOR,
} ValueKind;

typedef enum
{
  GLOBAL_ORDERED_DICT,
  GLOBAL_REBUILD_TENSOR_V2,
  GLOBAL_REBUILD_PARAMETER,
  GLOBAL_STORAGE,
} GlobalKind;

typedef struct _Value Value;

struct _Value
{
  ValueKind kind;
  union
  {
    gint64 i; /* INT, BOOL */
    double f;
    struct
    {
      char *s; /* STRING (NUL-terminated, no NUL inside), BYTES */
      gsize len;
    } str;
    struct
    {
      Value **items;
      guint n;
    } tuple;
    GPtrArray *list; /* LIST: Value*; DICT: key, value, key, value, … */
    struct
    {
      GlobalKind kind;
      GepardTorchStorage storage;
    } global;
    struct
    {
      GepardTorchStorage type;
      const char *key; /* the STRING value's text */
      guint64 numel;
    } storage;
    struct
    {
      const Value *storage;
      guint64 offset;
      guint n_dims;
      gint64 shape[GEPARD_TENSOR_MAX_DIMS];
      gint64 stride[GEPARD_TENSOR_MAX_DIMS];
    } tensor;
  } u;
};

typedef struct
{
  const guint8 *data;
  gsize len;
  gsize pos;    /* next byte to read */
  gsize op_pos; /* offset of the opcode being run, for messages */
  GPtrArray *pool;
  GPtrArray *stack; /* Value* */
  GArray *marks;    /* guint: stack lengths at each MARK */
  GHashTable *memo; /* index → Value* */
  guint memo_len;   /* MEMOIZE stores at len(memo), as Python counts it */
  Value *none;
} Machine;

static const struct
{
  const char *name;
  gsize element_size;
  gboolean has_dtype;
  GepardDType dtype;
} storage_types[] = {
    [GEPARD_TORCH_STORAGE_FLOAT] = {"FloatStorage", 4, TRUE, GEPARD_DTYPE_F32},
    [GEPARD_TORCH_STORAGE_DOUBLE] = {"DoubleStorage", 8, FALSE, GEPARD_DTYPE_F32},
    [GEPARD_TORCH_STORAGE_HALF] = {"HalfStorage", 2, TRUE, GEPARD_DTYPE_F16},
    [GEPARD_TORCH_STORAGE_BFLOAT16] = {"BFloat16Storage", 2, TRUE, GEPARD_DTYPE_BF16},
    [GEPARD_TORCH_STORAGE_INT] = {"IntStorage", 4, TRUE, GEPARD_DTYPE_I32},
    [GEPARD_TORCH_STORAGE_LONG] = {"LongStorage", 8, TRUE, GEPARD_DTYPE_I64},
};

const char *
gepard_torch_storage_name (GepardTorchStorage storage)
{
  g_return_val_if_fail ((guint)storage < G_N_ELEMENTS (storage_types), NULL);
  return storage_types[storage].name;
}

gsize
gepard_torch_storage_element_size (GepardTorchStorage storage)
{
  g_return_val_if_fail ((guint)storage < G_N_ELEMENTS (storage_types), 0);
  return storage_types[storage].element_size;
}

gboolean
gepard_torch_storage_to_dtype (GepardTorchStorage storage, GepardDType *dtype)
{
  g_return_val_if_fail ((guint)storage < G_N_ELEMENTS (storage_types), FALSE);
  if (!storage_types[storage].has_dtype)
    return FALSE;
  *dtype = storage_types[storage].dtype;
  return TRUE;
}

static gboolean fail (Machine *m, GError **error, GepardFormatError code, const char *format, ...)
    G_GNUC_PRINTF (4, 5);

static gboolean
fail (Machine *m, GError **error, GepardFormatError code, const char *format, ...)
{
  va_list args;
  g_autofree char *message = NULL;

  va_start (args, format);
  message = g_strdup_vprintf (format, args);
  va_end (args);
  g_set_error (error, GEPARD_FORMAT_ERROR, code, "data.pkl, offset %" G_GSIZE_FORMAT ": %s",
               m->op_pos, message);
  return FALSE;
}

/* ---- values ---- */

static void
value_free (gpointer data)
{
  Value *value = data;

  switch (value->kind)
    {
    case VALUE_STRING:
    case VALUE_BYTES:
      g_free (value->u.str.s);
      break;
    case VALUE_TUPLE:
      g_free (value->u.tuple.items);
      break;
    case VALUE_LIST:
    case VALUE_DICT:
      g_ptr_array_unref (value->u.list);
      break;
    case VALUE_NONE:
    case VALUE_BOOL:
    case VALUE_INT:
    case VALUE_FLOAT:
    case VALUE_GLOBAL:
    case VALUE_STORAGE:
    case VALUE_TENSOR:
    default:
      break;
    }
  g_free (value);
}

static Value *
value_new (Machine *m, ValueKind kind)
{
  Value *value = g_new0 (Value, 1);

  value->kind = kind;
  if (kind == VALUE_LIST || kind == VALUE_DICT)
    value->u.list = g_ptr_array_new ();
  g_ptr_array_add (m->pool, value);
  return value;
}

static const char *
kind_name (const Value *value)
{
  static const char *const names[] = {"None",  "bool", "int",  "float",    "str",       "bytes",
                                      "tuple", "list", "dict", "a global", "a storage", "a tensor"};

  return names[value->kind];
}

/* ---- input and stack ---- */

static gboolean
need (Machine *m, gsize n, GError **error)
{
  if (n > m->len - m->pos)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "truncated (an operand runs past the end)");
  return TRUE;
}

static guint64
read_le (Machine *m, guint n)
{
  guint64 v = 0;

  for (guint i = 0; i < n; i++)
    v |= (guint64)m->data[m->pos + i] << (8 * i);
  m->pos += n;
  return v;
}

static gboolean
push (Machine *m, Value *value, GError **error)
{
  if (m->stack->len >= MAX_STACK)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "stack deeper than %u values",
                 MAX_STACK);
  g_ptr_array_add (m->stack, value);
  return TRUE;
}

/* the stack length at the innermost MARK, or G_MAXUINT when the stack is above none */
static guint
mark_base (Machine *m)
{
  return m->marks->len == 0 ? 0 : g_array_index (m->marks, guint, m->marks->len - 1);
}

static gboolean
pop (Machine *m, Value **out, GError **error)
{
  *out = NULL;
  if (m->stack->len <= mark_base (m))
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "stack underflow");
  *out = g_ptr_array_steal_index (m->stack, m->stack->len - 1);
  return TRUE;
}

static gboolean
top (Machine *m, Value **out, GError **error)
{
  *out = NULL;
  if (m->stack->len <= mark_base (m))
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "stack underflow");
  *out = g_ptr_array_index (m->stack, m->stack->len - 1);
  return TRUE;
}

/* Pops everything above the innermost MARK and the mark itself; `*items` points into the stack's
 * storage until the next push, so callers copy them out first. */
static gboolean
pop_mark (Machine *m, Value ***items, guint *n, GError **error)
{
  guint base;

  if (m->marks->len == 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "no MARK to pop to");
  base = g_array_index (m->marks, guint, m->marks->len - 1);
  g_array_set_size (m->marks, m->marks->len - 1);
  *n = m->stack->len - base;
  /* an array that never held anything has no storage, and NULL + 0 is undefined in C */
  *items = *n > 0 ? (Value **)m->stack->pdata + base : NULL;
  return TRUE;
}

static void
drop_to (Machine *m, guint len)
{
  g_ptr_array_set_size (m->stack, len);
}

static Value *
make_tuple (Machine *m, Value *const *items, guint n)
{
  Value *tuple = value_new (m, VALUE_TUPLE);

  tuple->u.tuple.n = n;
  tuple->u.tuple.items = n > 0 ? g_memdup2 (items, sizeof (Value *) * n) : NULL;
  return tuple;
}

/* ---- globals ---- */

static gboolean
resolve_global (Machine *m, const char *module, gsize module_len, const char *name, gsize name_len,
                Value **out, GError **error)
{
  static const struct
  {
    const char *module;
    const char *name;
    GlobalKind kind;
    GepardTorchStorage storage;
  } allowed[] = {
      {"collections", "OrderedDict", GLOBAL_ORDERED_DICT, 0},
      {"torch._utils", "_rebuild_tensor_v2", GLOBAL_REBUILD_TENSOR_V2, 0},
      {"torch._utils", "_rebuild_parameter", GLOBAL_REBUILD_PARAMETER, 0},
      {"torch", "FloatStorage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_FLOAT},
      {"torch", "DoubleStorage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_DOUBLE},
      {"torch", "HalfStorage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_HALF},
      {"torch", "BFloat16Storage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_BFLOAT16},
      {"torch", "IntStorage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_INT},
      {"torch", "LongStorage", GLOBAL_STORAGE, GEPARD_TORCH_STORAGE_LONG},
  };
  g_autofree char *printable = NULL;

  for (guint i = 0; i < G_N_ELEMENTS (allowed); i++)
    {
      if (strlen (allowed[i].module) == module_len
          && memcmp (allowed[i].module, module, module_len) == 0
          && strlen (allowed[i].name) == name_len && memcmp (allowed[i].name, name, name_len) == 0)
        {
          Value *value = value_new (m, VALUE_GLOBAL);

          value->u.global.kind = allowed[i].kind;
          value->u.global.storage = allowed[i].storage;
          *out = value;
          return TRUE;
        }
    }
  /* the name comes from the file: make it printable before it goes into a message */
  printable = g_strdup_printf ("%.*s.%.*s", (int)module_len, module, (int)name_len, name);
  for (char *c = printable; *c != '\0'; c++)
    if (!g_ascii_isprint (*c))
      *c = '?';
  return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
               "global %s is not allowed (a state dict needs only collections.OrderedDict, "
               "torch._utils._rebuild_tensor_v2 / _rebuild_parameter and torch storages)",
               printable);
}

/* GLOBAL: "module\nname\n" */
static gboolean
op_global (Machine *m, GError **error)
{
  const char *start = (const char *)m->data + m->pos;
  gsize avail = MIN (m->len - m->pos, 2 * (MAX_GLOBAL_LEN + 1));
  const char *nl1 = memchr (start, '\n', avail);
  const char *nl2;
  Value *value;

  if (nl1 == NULL)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "unterminated GLOBAL");
  nl2 = memchr (nl1 + 1, '\n', avail - (gsize)(nl1 + 1 - start));
  if (nl2 == NULL)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "unterminated GLOBAL");
  if (!resolve_global (m, start, (gsize)(nl1 - start), nl1 + 1, (gsize)(nl2 - nl1 - 1), &value,
                       error))
    return FALSE;
  m->pos += (gsize)(nl2 + 1 - start);
  return push (m, value, error);
}

static gboolean
op_stack_global (Machine *m, GError **error)
{
  Value *module, *name, *value;

  if (!pop (m, &name, error) || !pop (m, &module, error))
    return FALSE;
  if (module->kind != VALUE_STRING || name->kind != VALUE_STRING)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "STACK_GLOBAL needs two strings");
  if (!resolve_global (m, module->u.str.s, module->u.str.len, name->u.str.s, name->u.str.len,
                       &value, error))
    return FALSE;
  return push (m, value, error);
}

/* ---- REDUCE: the only calls a state dict makes ---- */

static gboolean
int_tuple (Machine *m, const Value *value, const char *what, guint *n, gint64 *out, GError **error)
{
  if (value->kind != VALUE_TUPLE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "tensor %s is %s, not a tuple", what,
                 kind_name (value));
  if (value->u.tuple.n > GEPARD_TENSOR_MAX_DIMS)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "tensor with %u dims (at most %d)",
                 value->u.tuple.n, GEPARD_TENSOR_MAX_DIMS);
  for (guint i = 0; i < value->u.tuple.n; i++)
    {
      const Value *item = value->u.tuple.items[i];

      if (item->kind != VALUE_INT || item->u.i < 0)
        return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                     "tensor %s entry %u is not a non-negative integer", what, i);
      out[i] = item->u.i;
    }
  *n = value->u.tuple.n;
  return TRUE;
}

/* _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks
 * [, metadata]) */
static gboolean
rebuild_tensor (Machine *m, const Value *args, Value **out, GError **error)
{
  Value *const *a = args->u.tuple.items;
  Value *tensor;
  guint n_stride;

  if (args->u.tuple.n != 6 && args->u.tuple.n != 7)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "_rebuild_tensor_v2 with %u arguments",
                 args->u.tuple.n);
  if (a[0]->kind != VALUE_STORAGE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "_rebuild_tensor_v2 storage is %s, not a storage", kind_name (a[0]));
  if (a[1]->kind != VALUE_INT || a[1]->u.i < 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "_rebuild_tensor_v2 storage offset is not a non-negative integer");
  if (a[4]->kind != VALUE_BOOL)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "_rebuild_tensor_v2 requires_grad is %s, not a bool", kind_name (a[4]));
  /* backward hooks are an empty OrderedDict in a saved state dict; metadata is None or a dict */
  if (a[5]->kind != VALUE_DICT && a[5]->kind != VALUE_NONE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "_rebuild_tensor_v2 backward_hooks is %s",
                 kind_name (a[5]));
  if (args->u.tuple.n == 7 && a[6]->kind != VALUE_DICT && a[6]->kind != VALUE_NONE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "_rebuild_tensor_v2 metadata is %s",
                 kind_name (a[6]));

  tensor = value_new (m, VALUE_TENSOR);
  tensor->u.tensor.storage = a[0];
  tensor->u.tensor.offset = (guint64)a[1]->u.i;
  if (!int_tuple (m, a[2], "size", &tensor->u.tensor.n_dims, tensor->u.tensor.shape, error)
      || !int_tuple (m, a[3], "stride", &n_stride, tensor->u.tensor.stride, error))
    return FALSE;
  if (n_stride != tensor->u.tensor.n_dims)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "tensor has %u sizes but %u strides",
                 tensor->u.tensor.n_dims, n_stride);
  *out = tensor;
  return TRUE;
}

static gboolean
op_reduce (Machine *m, GError **error)
{
  Value *args, *callable, *result = NULL;

  if (!pop (m, &args, error) || !pop (m, &callable, error))
    return FALSE;
  if (callable->kind != VALUE_GLOBAL)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "REDUCE calls %s",
                 kind_name (callable));
  if (args->kind != VALUE_TUPLE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "REDUCE arguments are %s, not a tuple",
                 kind_name (args));
  switch (callable->u.global.kind)
    {
    case GLOBAL_ORDERED_DICT:
      /* OrderedDict() — its items follow with SETITEMS */
      if (args->u.tuple.n != 0)
        return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                     "OrderedDict called with arguments");
      result = value_new (m, VALUE_DICT);
      break;
    case GLOBAL_REBUILD_TENSOR_V2:
      if (!rebuild_tensor (m, args, &result, error))
        return FALSE;
      break;
    case GLOBAL_REBUILD_PARAMETER:
      /* _rebuild_parameter(data, requires_grad, backward_hooks): the tensor is the data */
      if (args->u.tuple.n != 3 || args->u.tuple.items[0]->kind != VALUE_TENSOR)
        return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                     "_rebuild_parameter needs (tensor, requires_grad, hooks)");
      result = args->u.tuple.items[0];
      break;
    case GLOBAL_STORAGE:
    default:
      return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "REDUCE calls torch.%s",
                   storage_types[callable->u.global.storage].name);
    }
  return push (m, result, error);
}

/* BINPERSID: ('storage', torch.<Type>Storage, key, location, numel) */
static gboolean
op_binpersid (Machine *m, GError **error)
{
  Value *pid, *storage;
  Value *const *a;

  if (!pop (m, &pid, error))
    return FALSE;
  if (pid->kind != VALUE_TUPLE || pid->u.tuple.n != 5)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                 "persistent id is not a 5-tuple ('storage', type, key, location, numel)");
  a = pid->u.tuple.items;
  if (a[0]->kind != VALUE_STRING || strcmp (a[0]->u.str.s, "storage") != 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                 "persistent id does not name a storage");
  if (a[1]->kind != VALUE_GLOBAL || a[1]->u.global.kind != GLOBAL_STORAGE)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "persistent id type is not a storage");
  if (a[2]->kind != VALUE_STRING || a[2]->u.str.len == 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "persistent id key is not a string");
  if (a[3]->kind != VALUE_STRING)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "persistent id location is not a string");
  if (a[4]->kind != VALUE_INT || a[4]->u.i < 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "persistent id numel is not a non-negative integer");

  storage = value_new (m, VALUE_STORAGE);
  storage->u.storage.type = a[1]->u.global.storage;
  storage->u.storage.key = a[2]->u.str.s;
  storage->u.storage.numel = (guint64)a[4]->u.i;
  return push (m, storage, error);
}

/* BUILD sets an object's state. The one use in a state dict is the OrderedDict's `_metadata`
 * attribute (a dict of module versions), which says nothing about the tensors: it is dropped.
 * Any other BUILD would change an object in ways this machine does not model. */
static gboolean
op_build (Machine *m, GError **error)
{
  Value *state, *target;

  if (!pop (m, &state, error) || !top (m, &target, error))
    return FALSE;
  if (target->kind == VALUE_DICT && (state->kind == VALUE_DICT || state->kind == VALUE_NONE))
    return TRUE;
  return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "BUILD of %s with %s", kind_name (target),
               kind_name (state));
}

/* ---- strings and numbers ---- */

static gboolean
op_string (Machine *m, ValueKind kind, guint len_bytes, GError **error)
{
  guint64 len;
  Value *value;

  if (!need (m, len_bytes, error))
    return FALSE;
  len = read_le (m, len_bytes);
  if (len > m->len - m->pos)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "a %" G_GUINT64_FORMAT "-byte string runs past the end", len);
  if (kind == VALUE_STRING
      && (memchr (m->data + m->pos, '\0', len) != NULL
          || !g_utf8_validate_len ((const char *)m->data + m->pos, len, NULL)))
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "string is not UTF-8 without NULs");
  value = value_new (m, kind);
  value->u.str.s = g_strndup ((const char *)m->data + m->pos, len);
  value->u.str.len = len;
  m->pos += len;
  return push (m, value, error);
}

static gboolean
push_int (Machine *m, gint64 v, GError **error)
{
  Value *value = value_new (m, VALUE_INT);

  value->u.i = v;
  return push (m, value, error);
}

/* LONG1 / LONG4: little-endian two's complement of the given length */
static gboolean
op_long (Machine *m, guint len_bytes, GError **error)
{
  guint64 n, bits = 0;

  if (!need (m, len_bytes, error))
    return FALSE;
  n = read_le (m, len_bytes);
  if (n > MAX_LONG_BYTES)
    return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "a %" G_GUINT64_FORMAT "-byte integer",
                 n);
  if (!need (m, n, error))
    return FALSE;
  if (n == 0)
    return push_int (m, 0, error);
  bits = read_le (m, (guint)n);
  if (n < 8 && (bits >> (8 * n - 1)) & 1)
    bits |= ~G_GUINT64_CONSTANT (0) << (8 * n); /* sign-extend */
  return push_int (m, (gint64)bits, error);
}

static gboolean
op_bool (Machine *m, gboolean v, GError **error)
{
  Value *value = value_new (m, VALUE_BOOL);

  value->u.i = v;
  return push (m, value, error);
}

/* ---- containers ---- */

static gboolean
op_tuple_n (Machine *m, guint n, GError **error)
{
  Value *items[3];
  Value *tuple;

  for (guint i = n; i-- > 0;)
    if (!pop (m, &items[i], error))
      return FALSE;
  tuple = make_tuple (m, items, n);
  return push (m, tuple, error);
}

static gboolean
op_tuple (Machine *m, GError **error)
{
  Value **items;
  guint n;
  guint base;
  Value *tuple;

  if (!pop_mark (m, &items, &n, error))
    return FALSE;
  base = m->stack->len - n;
  tuple = make_tuple (m, items, n);
  drop_to (m, base);
  return push (m, tuple, error);
}

static gboolean
op_setitems (Machine *m, gboolean marked, GError **error)
{
  Value **items;
  guint n;
  guint base;
  Value *dict;
  Value *pair[2];

  if (marked)
    {
      if (!pop_mark (m, &items, &n, error))
        return FALSE;
      if (n % 2 != 0)
        return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "SETITEMS with an odd number of items");
      base = m->stack->len - n;
    }
  else
    {
      if (!pop (m, &pair[1], error) || !pop (m, &pair[0], error))
        return FALSE;
      items = pair;
      n = 2;
      base = m->stack->len;
    }
  /* the dict sits just below the items (or the mark) */
  if (base == 0 || base <= mark_base (m))
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "SETITEM without a dict");
  dict = g_ptr_array_index (m->stack, base - 1);
  if (dict->kind != VALUE_DICT)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "SETITEM on %s", kind_name (dict));
  for (guint i = 0; i < n; i++)
    g_ptr_array_add (dict->u.list, items[i]);
  drop_to (m, base);
  return TRUE;
}

static gboolean
op_appends (Machine *m, gboolean marked, GError **error)
{
  Value **items;
  Value *one;
  guint n;
  guint base;
  Value *list;

  if (marked)
    {
      if (!pop_mark (m, &items, &n, error))
        return FALSE;
      base = m->stack->len - n;
    }
  else
    {
      if (!pop (m, &one, error))
        return FALSE;
      items = &one;
      n = 1;
      base = m->stack->len;
    }
  if (base == 0 || base <= mark_base (m))
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "APPEND without a list");
  list = g_ptr_array_index (m->stack, base - 1);
  if (list->kind != VALUE_LIST)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "APPEND to %s", kind_name (list));
  for (guint i = 0; i < n; i++)
    g_ptr_array_add (list->u.list, items[i]);
  drop_to (m, base);
  return TRUE;
}

/* LIST and DICT build from everything above the mark */
static gboolean
op_collect (Machine *m, ValueKind kind, GError **error)
{
  Value **items;
  guint n, base;
  Value *value;

  if (!pop_mark (m, &items, &n, error))
    return FALSE;
  if (kind == VALUE_DICT && n % 2 != 0)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "DICT with an odd number of items");
  base = m->stack->len - n;
  value = value_new (m, kind);
  for (guint i = 0; i < n; i++)
    g_ptr_array_add (value->u.list, items[i]);
  drop_to (m, base);
  return push (m, value, error);
}

/* ---- memo ---- */

static gboolean
memo_put (Machine *m, guint64 index, GError **error)
{
  Value *value;

  if (!top (m, &value, error))
    return FALSE;
  if (!g_hash_table_contains (m->memo, GUINT_TO_POINTER ((guint)index)))
    {
      if (m->memo_len >= MAX_MEMO)
        return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "more than %u memo entries",
                     MAX_MEMO);
      m->memo_len++;
    }
  g_hash_table_insert (m->memo, GUINT_TO_POINTER ((guint)index), value);
  return TRUE;
}

static gboolean
memo_get (Machine *m, guint64 index, GError **error)
{
  Value *value = g_hash_table_lookup (m->memo, GUINT_TO_POINTER ((guint)index));

  if (value == NULL)
    return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT,
                 "memo index %" G_GUINT64_FORMAT " was never stored", index);
  return push (m, value, error);
}

/* ---- the loop ---- */

static gboolean
run (Machine *m, Value **result, GError **error)
{
  while (TRUE)
    {
      guint8 op;

      m->op_pos = m->pos;
      /* one opcode builds at most one value: checking between opcodes bounds the pool */
      if (m->pool->len >= MAX_VALUES)
        return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "more than %u values", MAX_VALUES);
      if (m->pos >= m->len)
        return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "truncated (no STOP)");
      op = m->data[m->pos++];
      switch (op)
        {
        case 0x80: /* PROTO */
          if (!need (m, 1, error))
            return FALSE;
          if (m->data[m->pos] > 5)
            return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "pickle protocol %u",
                         m->data[m->pos]);
          m->pos++;
          break;
        case 0x95: /* FRAME: a length hint only */
          if (!need (m, 8, error))
            return FALSE;
          m->pos += 8;
          break;
        case '.': /* STOP */
          {
            Value *value;

            if (m->marks->len != 0)
              return fail (m, error, GEPARD_FORMAT_ERROR_CORRUPT, "STOP inside a MARK");
            if (!pop (m, &value, error))
              return FALSE;
            *result = value;
            return TRUE;
          }
        case '(': /* MARK */
          if (m->marks->len >= MAX_MARKS)
            return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "more than %u nested MARKs",
                         MAX_MARKS);
          g_array_append_val (m->marks, m->stack->len);
          break;
        case '0': /* POP */
          {
            Value *ignored;

            if (!pop (m, &ignored, error))
              return FALSE;
            break;
          }
        case '1': /* POP_MARK */
          {
            Value **items;
            guint n;

            if (!pop_mark (m, &items, &n, error))
              return FALSE;
            drop_to (m, m->stack->len - n);
            break;
          }
        case 'N': /* NONE */
          if (!push (m, m->none, error))
            return FALSE;
          break;
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
          if (!op_bool (m, op == 0x88, error))
            return FALSE;
          break;
        case 'J': /* BININT: signed 32-bit */
          if (!need (m, 4, error) || !push_int (m, (gint32)(guint32)read_le (m, 4), error))
            return FALSE;
          break;
        case 'K': /* BININT1 */
          if (!need (m, 1, error) || !push_int (m, (gint64)read_le (m, 1), error))
            return FALSE;
          break;
        case 'M': /* BININT2 */
          if (!need (m, 2, error) || !push_int (m, (gint64)read_le (m, 2), error))
            return FALSE;
          break;
        case 0x8a: /* LONG1 */
          if (!op_long (m, 1, error))
            return FALSE;
          break;
        case 0x8b: /* LONG4 */
          if (!op_long (m, 4, error))
            return FALSE;
          break;
        case 'G': /* BINFLOAT: big-endian double */
          {
            guint64 bits = 0;
            Value *value;

            if (!need (m, 8, error))
              return FALSE;
            for (int i = 0; i < 8; i++)
              bits = (bits << 8) | m->data[m->pos + i];
            m->pos += 8;
            value = value_new (m, VALUE_FLOAT);
            memcpy (&value->u.f, &bits, 8);
            if (!push (m, value, error))
              return FALSE;
            break;
          }
        case 'X': /* BINUNICODE */
          if (!op_string (m, VALUE_STRING, 4, error))
            return FALSE;
          break;
        case 0x8c: /* SHORT_BINUNICODE */
          if (!op_string (m, VALUE_STRING, 1, error))
            return FALSE;
          break;
        case 0x8d: /* BINUNICODE8 */
          if (!op_string (m, VALUE_STRING, 8, error))
            return FALSE;
          break;
        case 'B': /* BINBYTES */
          if (!op_string (m, VALUE_BYTES, 4, error))
            return FALSE;
          break;
        case 'C': /* SHORT_BINBYTES */
          if (!op_string (m, VALUE_BYTES, 1, error))
            return FALSE;
          break;
        case 0x8e: /* BINBYTES8 */
          if (!op_string (m, VALUE_BYTES, 8, error))
            return FALSE;
          break;
        case ')': /* EMPTY_TUPLE */
          if (!push (m, make_tuple (m, NULL, 0), error))
            return FALSE;
          break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: /* TUPLE3 */
          if (!op_tuple_n (m, op - 0x84, error))
            return FALSE;
          break;
        case 't': /* TUPLE */
          if (!op_tuple (m, error))
            return FALSE;
          break;
        case ']': /* EMPTY_LIST */
          if (!push (m, value_new (m, VALUE_LIST), error))
            return FALSE;
          break;
        case 'l': /* LIST */
          if (!op_collect (m, VALUE_LIST, error))
            return FALSE;
          break;
        case 'a': /* APPEND */
        case 'e': /* APPENDS */
          if (!op_appends (m, op == 'e', error))
            return FALSE;
          break;
        case '}': /* EMPTY_DICT */
          if (!push (m, value_new (m, VALUE_DICT), error))
            return FALSE;
          break;
        case 'd': /* DICT */
          if (!op_collect (m, VALUE_DICT, error))
            return FALSE;
          break;
        case 's': /* SETITEM */
        case 'u': /* SETITEMS */
          if (!op_setitems (m, op == 'u', error))
            return FALSE;
          break;
        case 'c': /* GLOBAL */
          if (!op_global (m, error))
            return FALSE;
          break;
        case 0x93: /* STACK_GLOBAL */
          if (!op_stack_global (m, error))
            return FALSE;
          break;
        case 'R': /* REDUCE */
          if (!op_reduce (m, error))
            return FALSE;
          break;
        case 'Q': /* BINPERSID */
          if (!op_binpersid (m, error))
            return FALSE;
          break;
        case 'b': /* BUILD */
          if (!op_build (m, error))
            return FALSE;
          break;
        case 'q': /* BINPUT */
          if (!need (m, 1, error) || !memo_put (m, read_le (m, 1), error))
            return FALSE;
          break;
        case 'r': /* LONG_BINPUT */
          if (!need (m, 4, error) || !memo_put (m, read_le (m, 4), error))
            return FALSE;
          break;
        case 0x94: /* MEMOIZE */
          if (!memo_put (m, m->memo_len, error))
            return FALSE;
          break;
        case 'h': /* BINGET */
          if (!need (m, 1, error) || !memo_get (m, read_le (m, 1), error))
            return FALSE;
          break;
        case 'j': /* LONG_BINGET */
          if (!need (m, 4, error) || !memo_get (m, read_le (m, 4), error))
            return FALSE;
          break;
        default:
          return fail (m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED,
                       "opcode 0x%02x is outside what torch.save writes for a state dict", op);
        }
    }
}

static void
pickle_tensor_free (gpointer data)
{
  GepardPickleTensor *tensor = data;

  g_free (tensor->name);
  g_free (tensor->storage_key);
  g_free (tensor);
}

static gboolean
wanted (const char *name, const char *const *prefixes)
{
  if (prefixes == NULL)
    return TRUE;
  for (guint i = 0; prefixes[i] != NULL; i++)
    if (g_str_has_prefix (name, prefixes[i]))
      return TRUE;
  return FALSE;
}

GPtrArray *
gepard_pickle_load_state_dict (const guint8 *data, gsize len, const char *const *prefixes,
                               GError **error)
{
  g_autoptr (GPtrArray) tensors = NULL;
  g_autoptr (GHashTable) seen = NULL;
  Machine m = {0};
  Value *result = NULL;
  gboolean ok;

  g_return_val_if_fail (data != NULL || len == 0, NULL);
  g_return_val_if_fail (error == NULL || *error == NULL, NULL);

  m.data = data;
  m.len = len;
  m.pool = g_ptr_array_new_with_free_func (value_free);
  m.stack = g_ptr_array_new ();
  m.marks = g_array_new (FALSE, FALSE, sizeof (guint));
  m.memo = g_hash_table_new (g_direct_hash, g_direct_equal);
  m.none = value_new (&m, VALUE_NONE);

  ok = run (&m, &result, error);
  if (ok && result->kind != VALUE_DICT)
    ok = fail (&m, error, GEPARD_FORMAT_ERROR_UNSUPPORTED, "the pickle holds %s, not a state dict",
               kind_name (result));

  tensors = g_ptr_array_new_with_free_func (pickle_tensor_free);
  seen = g_hash_table_new (g_str_hash, g_str_equal);
  for (guint i = 0; ok && i + 1 < result->u.list->len; i += 2)
    {
      const Value *key = g_ptr_array_index (result->u.list, i);
      const Value *value = g_ptr_array_index (result->u.list, i + 1);
      GepardPickleTensor *tensor;

      if (key->kind != VALUE_STRING)
        {
          ok = fail (&m, error, GEPARD_FORMAT_ERROR_CORRUPT, "a state dict key is %s, not a str",
                     kind_name (key));
          break;
        }
      if (!wanted (key->u.str.s, prefixes))
        continue;
      if (value->kind != VALUE_TENSOR)
        {
          ok = fail (&m, error, GEPARD_FORMAT_ERROR_CORRUPT, "state dict entry %s is %s",
                     key->u.str.s, kind_name (value));
          break;
        }
      if (!g_hash_table_add (seen, key->u.str.s))
        {
          ok = fail (&m, error, GEPARD_FORMAT_ERROR_CORRUPT, "state dict entry %s appears twice",
                     key->u.str.s);
          break;
        }
      tensor = g_new0 (GepardPickleTensor, 1);
      tensor->name = g_strdup (key->u.str.s);
      tensor->storage_type = value->u.tensor.storage->u.storage.type;
      tensor->storage_key = g_strdup (value->u.tensor.storage->u.storage.key);
      tensor->storage_numel = value->u.tensor.storage->u.storage.numel;
      tensor->storage_offset = value->u.tensor.offset;
      tensor->n_dims = value->u.tensor.n_dims;
      memcpy (tensor->shape, value->u.tensor.shape, sizeof tensor->shape);
      memcpy (tensor->stride, value->u.tensor.stride, sizeof tensor->stride);
      g_ptr_array_add (tensors, tensor);
    }

  g_hash_table_unref (m.memo);
  g_array_unref (m.marks);
  g_ptr_array_unref (m.stack);
  g_ptr_array_unref (m.pool);
  if (!ok)
    return NULL;
  return g_steal_pointer (&tensors);
}
