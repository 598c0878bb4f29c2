-- 001_voices.sql: cloned voices.
--
-- A voice is a speaker prefix [prefix_rows × prefix_hidden] of little-endian fp32 (the bytes of a
-- prefix file, gepard-voice.h) plus the metadata a Cartesia voice object carries. A prefix only
-- means something to the model that produced it, so each row names that model and its shape, and
-- a server running another model refuses it instead of conditioning on noise.
--
-- The migration runner (server/gepard-voice-store.c) wraps each file in one transaction and
-- records it in schema_migrations; the files hold no BEGIN/COMMIT of their own.

CREATE TABLE voices (
  id uuid PRIMARY KEY DEFAULT gen_random_uuid (),
  name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 200),
  description text NOT NULL DEFAULT '' CHECK (char_length(description) <= 2000),
  -- a language code as the clone request sent it ("en", "pt-BR")
  language text NOT NULL CHECK (char_length(language) BETWEEN 1 AND 35),
  -- optional Cartesia voice fields (the clone request's accent; gender as PATCH /voices sets it)
  accent text CHECK (char_length(accent) <= 100),
  gender text CHECK (char_length(gender) <= 50),
  created_at timestamptz NOT NULL DEFAULT now(),
  -- identity of the model the prefix was computed for
  model text NOT NULL CHECK (char_length(model) BETWEEN 1 AND 200),
  prefix_rows integer NOT NULL CHECK (prefix_rows > 0),
  prefix_hidden integer NOT NULL CHECK (prefix_hidden > 0),
  prefix bytea NOT NULL
    CHECK (octet_length(prefix) = prefix_rows::bigint * prefix_hidden::bigint * 4)
);

-- GET /voices pages through one model's voices newest first, keyed on (created_at, id) so that
-- voices created in the same instant still have a total order for starting_after/ending_before.
CREATE INDEX voices_model_created_at_id ON voices (model, created_at DESC, id DESC);
