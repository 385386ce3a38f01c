-- The outbox schema as every migration together leaves it (generated: python -m tests.schema_file --write).
-- Read-only: change the schema with a new migration in migrations/.
CREATE FUNCTION public.composer_notify_cancel() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('outbox_cancel', '');
    RETURN NULL;
END;
$$;

CREATE FUNCTION public.composer_notify_outbox() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('outbox_new', '');
    RETURN NULL;
END;
$$;

CREATE FUNCTION public.outbox_cancel_run(run text) RETURNS bigint
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO '$user', 'public'
    AS $$
    INSERT INTO outbox_cancel (run_id) VALUES (run)
    ON CONFLICT (run_id) DO UPDATE SET cancelled_at = now();
    WITH gone AS (
        DELETE FROM outbox
         WHERE id IN (SELECT id FROM outbox
                       WHERE status IN ('PENDING', 'RETRY') AND payload ->> 'run_id' = run
                         FOR UPDATE SKIP LOCKED)
        RETURNING 1
    )
    SELECT count(*) FROM gone;
$$;

CREATE TABLE public.outbox (
    id text NOT NULL,
    task_id text,
    stream text NOT NULL,
    payload jsonb,
    type text,
    status text DEFAULT 'PENDING'::text NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    max_retries integer DEFAULT 5 NOT NULL,
    next_attempt_at timestamp with time zone,
    last_error text,
    backoff_seconds integer DEFAULT 5 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    suspect boolean DEFAULT false NOT NULL,
    CONSTRAINT outbox_status_check CHECK ((status = ANY (ARRAY['PENDING'::text, 'RETRY'::text, 'DLQ'::text])))
)
WITH (autovacuum_vacuum_scale_factor='0.0', autovacuum_vacuum_threshold='5000', autovacuum_vacuum_insert_scale_factor='0.0', autovacuum_vacuum_insert_threshold='5000', autovacuum_analyze_scale_factor='0.0', autovacuum_analyze_threshold='5000', autovacuum_vacuum_cost_delay='0');

CREATE UNLOGGED TABLE public.outbox_batches (
    token uuid NOT NULL,
    xact xid8 NOT NULL,
    ids text[] NOT NULL,
    enqueuer text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    probe boolean DEFAULT false NOT NULL
);

CREATE TABLE public.outbox_cancel (
    run_id text NOT NULL,
    cancelled_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT outbox_cancel_run_id_check CHECK ((run_id <> ''::text))
);

CREATE TABLE public.outbox_dlq (
    id text NOT NULL,
    task_id text,
    stream text NOT NULL,
    payload jsonb,
    type text,
    last_error text,
    attempts integer NOT NULL,
    max_retries integer DEFAULT 5 NOT NULL,
    backoff_seconds integer DEFAULT 5 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    moved_at timestamp with time zone DEFAULT now() NOT NULL
);

CREATE TABLE public.outbox_schema_version (
    version integer NOT NULL,
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT now() NOT NULL
);

ALTER TABLE ONLY public.outbox_batches
    ADD CONSTRAINT outbox_batches_pkey PRIMARY KEY (token);

ALTER TABLE ONLY public.outbox_cancel
    ADD CONSTRAINT outbox_cancel_pkey PRIMARY KEY (run_id);

ALTER TABLE ONLY public.outbox_dlq
    ADD CONSTRAINT outbox_dlq_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.outbox_schema_version
    ADD CONSTRAINT outbox_schema_version_pkey PRIMARY KEY (version);

ALTER TABLE public.outbox
    ADD CONSTRAINT outbox_stream_check CHECK ((stream ~ '^workflow\.tasks\.([A-Za-z0-9_-]{1,200})(\.[0-9]+)?$'::text)) NOT VALID;

CREATE INDEX idx_outbox_fresh ON public.outbox USING btree (created_at) WHERE ((status = ANY (ARRAY['PENDING'::text, 'RETRY'::text])) AND (next_attempt_at IS NULL) AND (NOT suspect));

CREATE INDEX idx_outbox_scheduled ON public.outbox USING btree (next_attempt_at) WHERE ((status = ANY (ARRAY['PENDING'::text, 'RETRY'::text])) AND (next_attempt_at IS NOT NULL) AND (NOT suspect));

CREATE INDEX idx_outbox_suspect ON public.outbox USING btree (next_attempt_at) WHERE ((status = ANY (ARRAY['PENDING'::text, 'RETRY'::text])) AND suspect);

CREATE INDEX idx_outbox_task_id ON public.outbox USING btree (task_id) WHERE (task_id IS NOT NULL);

CREATE TRIGGER outbox_cancel_notify AFTER INSERT OR UPDATE ON public.outbox_cancel FOR EACH STATEMENT EXECUTE FUNCTION public.composer_notify_cancel();

CREATE TRIGGER outbox_notify AFTER INSERT ON public.outbox FOR EACH STATEMENT WHEN ((NOT pg_try_advisory_xact_lock_shared('122468465667173'::bigint))) EXECUTE FUNCTION public.composer_notify_outbox();
