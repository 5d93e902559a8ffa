-- keiro 0009: every keiro function resolves names through a search_path of its own, never
-- through its caller's.
--
-- Until now the functions ran with the caller's search_path and called built-ins unqualified
-- (to_jsonb, jsonb_build_object, now(), ...), so a role that can create objects in a schema the
-- caller searches could have them call its own code instead (CVE-2018-1058): an overload with a
-- more specific argument type (`to_jsonb(text)` against `pg_catalog.to_jsonb(anyelement)`) wins
-- wherever it sits on the path, one with the built-in's very signature wins when searched before
-- pg_catalog; and a temporary table named like one of keiro's is searched before every schema
-- unless pg_temp is listed.
--
-- Each function now carries `SET search_path = <this schema>, pg_temp`:
-- * pg_catalog is left out on purpose: Postgres searches an unlisted pg_catalog first, so the
--   built-ins come before anything in keiro's schema all the same. Listing it first would
--   resolve names the same way but make `current_schema()` return `pg_catalog`, and the wake
--   channel and the signal lock key are derived from `current_schema()`.
-- * keiro's tables and functions, which the bodies name unqualified, resolve in this schema.
-- * pg_temp, listed last, can no longer shadow a table.
-- What remains trusted is keiro's own schema: the store refuses a schema others may create
-- objects in (`public`) unless the caller explicitly allows it.
--
-- `ALTER FUNCTION ... SET` keeps a function's other settings (0007's plan settings), but
-- `CREATE OR REPLACE FUNCTION` drops them all: a later migration that replaces a function must
-- set search_path again (the test `every_function_of_the_schema_pins_its_search_path` fails
-- otherwise).
--
-- Only keiro's functions are altered (named `keiro_`, not an extension's), so the other
-- functions of a schema keiro was explicitly allowed to share are left as they are. The migration
-- runner's connections have keiro's schema as their search_path, hence `current_schema()`.

DO $$
DECLARE
    v_function regprocedure;
BEGIN
    FOR v_function IN
        SELECT p.oid::regprocedure
        FROM pg_catalog.pg_proc p
        JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = pg_catalog.current_schema()
          AND p.prokind = 'f'
          AND p.proname LIKE 'keiro\_%'
          AND NOT EXISTS (
              SELECT 1 FROM pg_catalog.pg_depend d
              WHERE d.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
                AND d.objid = p.oid AND d.deptype = 'e')
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET search_path = %I, pg_temp',
                                  v_function, pg_catalog.current_schema());
    END LOOP;
END;
$$;
