-- 0009: the claim returns each row's stream entry as a packed XADD command.
--
-- The enqueuer then writes a batch to Redis as one buffer, without decoding a payload or
-- re-encoding its fields row by row. These functions are the one definition of that encoding
-- on the database side. Where they cannot write exactly the bytes the enqueuer's own encoder
-- writes, they return NULL and the enqueuer encodes that row itself.
--
-- outbox_queue, outbox_route, outbox_resp and outbox_entry are single SELECTs that the
-- planner inlines into the claim, so no function is called per row but the
-- hash.

-- FNV-1a 32-bit of the UTF-8 bytes of a text: the numbers of Go's hash/fnv New32a.
CREATE OR REPLACE FUNCTION outbox_fnv1a32(t text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    b bytea := convert_to(t, 'UTF8');
    h bigint := 2166136261;
BEGIN
    FOR i IN 0 .. length(b) - 1 LOOP
        h := ((h # get_byte(b, i)) * 16777619) & 4294967295;
    END LOOP;
    RETURN h;
END;
$$;

-- The queue of a stream named workflow.tasks.<queue>.<n> or workflow.tasks.<queue>, where
-- outbox_route has matched one of those shapes.
CREATE OR REPLACE FUNCTION outbox_queue(stream text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT CASE WHEN rtrim(substr(stream, 16), '0123456789') LIKE '%.'
            THEN left(rtrim(substr(stream, 16), '0123456789'), -1)
            ELSE substr(stream, 16) END
$$;

-- The stream a row is published to at "shards" shards: workflow.tasks.<queue>.<n> for a
-- task queue's stream (stored with or without a shard number; a queue is 1-200 of A-Z a-z
-- 0-9 _ -), n = FNV-1a32 of the task id (of the row id if it has none) mod shards; any
-- other stream as stored. NULL for a stream with a character outside ASCII: the enqueuer
-- routes those (more than 0-9 are digits to it). The queue's length is checked apart: a
-- bounded repeat ({1,200}) is slow in PostgreSQL's regex engine.
CREATE OR REPLACE FUNCTION outbox_route(stream text, task_id text, id text, shards int)
RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT CASE
    WHEN octet_length(stream) <> length(stream) THEN NULL
    WHEN stream ~ '^workflow\.tasks\.[A-Za-z0-9_-]+(\.[0-9]+)?$'
         AND length(outbox_queue(stream)) <= 200
        THEN 'workflow.tasks.' || outbox_queue(stream) || '.'
             || CASE WHEN shards <= 1 THEN 0
                     ELSE outbox_fnv1a32(coalesce(nullif(task_id, ''), id)) % shards END::text
    ELSE coalesce(nullif(stream, ''), 'workflow.tasks')
END
$$;

-- A RESP bulk string (byte length, bytes; the database encoding is UTF-8, see outbox_entry).
CREATE OR REPLACE FUNCTION outbox_resp(t text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
SELECT '$' || octet_length(t)::text || E'\r\n' || t || E'\r\n'
$$;

-- XADD <target> * <fields>, packed as RESP, in "command" (one row). The fields: each
-- top-level key of the payload object in its stored order, its value a string as is, an
-- integer, true, false or null as its JSON text, and outbox_id (in place of a payload key of
-- that name, else last); a NULL payload gives id and outbox_id; a payload that is a string,
-- number, boolean or null gives data (its JSON text) and outbox_id.
-- NULL, for the enqueuer to encode, where its JSON encoder may write other bytes or fail:
-- a nested object or array (it drops the spaces, escapes non-ASCII, has a depth limit),
-- a number with a fraction (it writes the shortest float: 1.50 -> 1.5), an integer of more
-- than 640 digits (over its decoder's length limit), a payload that is an array; a payload
-- with one of the keys in "keep" (a trace context: the enqueuer opens a span for it); a
-- NULL target; and any row in a database whose encoding is not UTF-8 (octet_length would
-- not count UTF-8 bytes).
CREATE OR REPLACE FUNCTION outbox_entry(target text, payload jsonb, id text, keep text[])
RETURNS TABLE (command text) LANGUAGE sql STABLE PARALLEL SAFE AS $$
SELECT CASE
    WHEN current_setting('server_encoding') <> 'UTF8' THEN NULL
    WHEN payload IS NULL THEN
        E'*7\r\n$4\r\nXADD\r\n' || outbox_resp(target) || E'$1\r\n*\r\n$2\r\nid\r\n'
        || outbox_resp(id) || E'$9\r\noutbox_id\r\n' || outbox_resp(id)
    WHEN jsonb_typeof(payload) = 'object' THEN
        '*' || (3 + 2 * (f.n + (NOT f.has_id)::int))::text || E'\r\n$4\r\nXADD\r\n'
        || outbox_resp(target) || E'$1\r\n*\r\n' || f.fields
        || CASE WHEN f.has_id THEN '' ELSE E'$9\r\noutbox_id\r\n' || outbox_resp(id) END
    WHEN jsonb_typeof(payload) = 'array' THEN NULL
    ELSE
        E'*7\r\n$4\r\nXADD\r\n' || outbox_resp(target) || E'$1\r\n*\r\n$4\r\ndata\r\n'
        || outbox_resp(payload::text) || E'$9\r\noutbox_id\r\n' || outbox_resp(id)
END
  FROM (
    SELECT count(*)::int AS n,
           coalesce(bool_or(k = 'outbox_id'), false) AS has_id,
           CASE WHEN coalesce(bool_and(exact), true) AND NOT coalesce(bool_or(k = ANY(keep)), false)
                THEN coalesce(string_agg(outbox_resp(k) || outbox_resp(v), ''), '')
           END AS fields
      FROM (
        -- jsonb_each_text gives a string's text and any other value's JSON text, in the
        -- payload's key order, which the aggregate keeps (an ORDER BY would sort each row's
        -- keys apart: several microseconds). Only a value that could be a number, object or
        -- array needs its type looked up (by its first character: no regex).
        SELECT e.k,
               CASE WHEN e.k = 'outbox_id' THEN id ELSE coalesce(e.v, 'null') END AS v,
               e.v IS NULL OR strpos('-0123456789[{', left(e.v, 1)) = 0
               OR jsonb_typeof(payload -> e.k) = 'string'
               OR (strpos(e.v, '.') = 0 AND octet_length(e.v) <= 640
                   AND left(e.v, 1) NOT IN ('[', '{')) AS exact
          FROM jsonb_each_text(CASE WHEN jsonb_typeof(payload) = 'object' THEN payload END)
               AS e(k, v)
        OFFSET 0  -- each value computed once, not once per reference above
      ) kv
  ) f
$$;
