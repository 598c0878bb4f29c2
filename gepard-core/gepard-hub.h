/* gepard-hub.h: where a model named by the user lives on disk.
 *
 * A model is a directory path, or a Hugging Face repo id ("owner/name", optionally "@revision")
 * found in the local cache (HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub) in the hub's layout: models--owner--name/refs/<rev> holds a commit
 * hash and models--owner--name/snapshots/<hash>/ the files. Nothing here touches the network. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The Hugging Face cache directory the environment selects. */
char *gepard_hub_cache_dir (void);

/* TRUE when `name` has the shape of a repo id ("owner/name" or "owner/name@rev"). */
gboolean gepard_hub_is_repo_id (const char *name);

/* The directory holding the model's files: `model` itself when it is an existing directory, else
 * the cached snapshot of the repo id. GEPARD_HUB_ERROR_NOT_FOUND names what was looked for. */
char *gepard_hub_resolve (const char *model, GError **error);

G_END_DECLS
