/* gepard-hub.h: where a model named by the user lives on disk.
 *
 * A model is a directory path, or a Hugging Face repo id ("owner/name", optionally "@revision")
 * found in the local cache (HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub,
 * else ~/.cache/huggingface/hub) in the hub's layout: models--owner--name/refs/<rev> holds a commit
 * hash and models--owner--name/snapshots/<hash>/ the files. Nothing here touches the network: the
 * server's download client (server/gepard-hub-download.h) fills the same layout. */
#pragma once

#include <glib.h>

G_BEGIN_DECLS

/* The published NanoCodec repo: a model with no codec beside it decodes with the .nemo file of
 * its snapshot in the local cache. */
#define GEPARD_HUB_CODEC_REPO "nvidia/nemo-nano-codec-22khz-1.89kbps-21.5fps"

/* The Hugging Face cache directory the environment selects. */
char *gepard_hub_cache_dir (void);

/* TRUE when `name` has the shape of a repo id ("owner/name" or "owner/name@rev"). */
gboolean gepard_hub_is_repo_id (const char *name);

/* Splits a repo id "owner/name[@revision]" into "owner/name" and the revision (NULL when none
 * is given). GEPARD_HUB_ERROR_INVALID_NAME when `name` is not a repo id. */
gboolean gepard_hub_split_repo_id (const char *name, char **repo, char **revision, GError **error);

/* The cache directory of a repo ("owner/name"): <cache>/models--owner--name. */
char *gepard_hub_repo_dir (const char *repo);

/* TRUE when HF_HUB_OFFLINE is set to 1, true, yes or on, as huggingface_hub reads it. */
gboolean gepard_hub_is_offline (void);

/* The directory holding the model's files: `model` itself when it is an existing directory, else
 * the cached snapshot of the repo id. GEPARD_HUB_ERROR_NOT_FOUND names what was looked for. */
char *gepard_hub_resolve (const char *model, GError **error);

/* The model used where none is named: GEPARD_MODEL where it is set, else the default
 * voice shipped with Gepard (installed as <datadir>/gepard/voice; models/voice of the source tree
 * when running from the build directory) where its files are there; NULL where there is none. */
char *gepard_hub_default_model (void);

G_END_DECLS
