-- lock_events_notify, as migration 0010 installs it.
--
-- One notification per inserting statement, and PostgreSQL folds identical ones
-- of a transaction into one: a payload would make every event its own.
CREATE OR REPLACE FUNCTION lock_events_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM lock_event_listeners) THEN
        PERFORM pg_notify('lockkeeper_events', '');
    END IF;
    RETURN NULL;
END
$$
