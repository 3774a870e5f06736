"""The PL/Proxy router install, generated from a partition's catalog
(docs/scale-out.md).

Every public ``alk.*`` function of a partition (a database with pyalk
installed) gets a router function with the same name, arguments, defaults and
result that runs it on one partition, chosen by the hash of its queue, stream,
lock, schedule or outbox name (docs/contract.md#scale-out: the name comes first), or on all
partitions for the cross-partition reads. Nothing here is written per
function but the few routing decisions in :data:`ROUTES`; a function the
rules cannot place stops the generation, so a new SQL function forces a
decision instead of being routed by accident.

The cluster is a SQL/MED server ``alk`` (``p0``, ``p1``, ... conninfos, a
power of two of them, as PL/Proxy requires) with a user mapping for PUBLIC:
it leaves PL/Proxy's global ``plproxy.get_cluster_*`` functions to whoever
else uses them, and credentials live in the mapping, not in the conninfos.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import psycopg

#: The arguments that name the thing a call works on, in the order docs/contract.md#scale-out puts them first.
ROUTING_ARGUMENTS = ("queue", "stream", "name", "outbox")

#: Functions whose routing the argument names do not decide.
#: "any": one partition, any (pure or clock functions); "all": every
#: partition, set results concatenated and then sorted by their first column
#: (which is how a single server orders them); "hash_or_all": by the hash of
#: the first argument, or every partition when it is NULL; "queue_or_all": a
#: boolean answer about a worker, by the hash of its optional queue argument,
#: or asked of every partition when it is NULL (true where any says true, NULL
#: where none knows the worker); "hash:<argument>": by the hash of that
#: argument (not the first); "custom": a body
#: of its own in _CUSTOM; "local": not proxied, because it manages the
#: database it runs in (roles and grants: run it on each partition, and grant
#: the router's own functions on the router).
ROUTES: dict[str, str] = {
    "now": "any",
    "pinned_clock": "any",
    "clock_privilege": "local",
    "grant_reader": "local",
    "grant_producer": "local",
    "grant_worker": "local",
    "grant_admin": "local",
    "revoke_all": "local",
    "role_grants": "local",
    "role_functions": "local",
    "limit_names": "local",
    "name_limits": "local",
    "cron_next": "any",
    "schema_info": "any",
    "list_schedules": "all",
    "queue_stats": "hash_or_all",
    "tick": "custom",
    "scheduler_tick": "custom",
    # The fence is the in-progress transactions of one server: a worker going
    # idle through the router reads it on some partition, so its re-claim after
    # the fence covers that partition's enqueues only; the fallback poll covers
    # the rest (docs/scale-out.md).
    "wake_fence": "any",
    # 0011 observe: the whole-system reads gather every partition.
    "list_locks": "all",
    "schedule_overview": "all",
    "stream_stats": "hash_or_all",
    "stream_consumer_lag": "hash_or_all",
    "queue_throughput": "hash_or_all",
    # 0024 workers: a worker's row lives with its queue (its control channel
    # then fires where it LISTENs for the queue's wake-ups). An operator's
    # request_stop needs only the worker id: without the queue, every
    # partition is asked, as is the whole registry for workers().
    "worker_register": "hash:queue",
    "worker_beat": "queue_or_all",
    "worker_deregister": "queue_or_all",
    "request_stop": "queue_or_all",
    "workers": "all",
    # 0031 rotation: each partition rotates its own job storage; a call
    # through the router rotates the partition it lands on, and workers'
    # calls land on every partition in turn.
    "rotate_jobs": "any",
}

#: The job operations take the queue last and optional (job ids are unique
#: per partition only, so through the router it is required).
_JOB_ID_ARGUMENTS = ("job_id", "job_ids")


class RouterError(RuntimeError):
    """The catalog holds something the router cannot place."""


@dataclass(frozen=True)
class Function:
    name: str
    arguments: str  # pg_get_function_arguments: names, types, defaults
    identity: str  # pg_get_function_identity_arguments
    result: str  # pg_get_function_result
    returns_set: bool
    in_names: tuple[str, ...]  # the IN (and INOUT) argument names, in order

    @property
    def call_arguments(self) -> str:
        return ", ".join(self.in_names)

    def route(self) -> str:
        """How a call is routed: "hash:<arg>", "job:<arg>", or a ROUTES kind."""
        if self.name in ROUTES:
            return ROUTES[self.name]
        if self.in_names and self.in_names[0] in ROUTING_ARGUMENTS:
            return f"hash:{self.in_names[0]}"
        if "queue" in self.in_names and any(a in self.in_names for a in _JOB_ID_ARGUMENTS):
            return "job:queue"
        raise RouterError(
            f"no routing rule for alk.{self.name}({self.identity}): its first argument is not one of "
            f"{', '.join(ROUTING_ARGUMENTS)}; add it to pyalk.schema.router.ROUTES"
        )


_FUNCTIONS = """
SELECT p.proname, pg_get_function_arguments(p.oid), pg_get_function_identity_arguments(p.oid),
       pg_get_function_result(p.oid), p.proretset,
       ARRAY(SELECT a.name FROM unnest(p.proargnames, p.proargmodes) AS a(name, mode)
              WHERE coalesce(a.mode, 'i') IN ('i', 'b') AND a.name IS NOT NULL)
  FROM pg_proc p
 WHERE p.pronamespace = 'alk'::regnamespace AND p.proname !~ '^_' AND p.prokind = 'f'
 ORDER BY p.proname = 'now' DESC, p.proname, pg_get_function_identity_arguments(p.oid)
"""

#: The composite types the public functions return, column by column.
_TYPES = """
SELECT t.typname, a.attname, format_type(a.atttypid, a.atttypmod)
  FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
 WHERE t.typnamespace = 'alk'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
   AND t.oid IN (SELECT p.prorettype FROM pg_proc p
                  WHERE p.pronamespace = 'alk'::regnamespace AND p.proname !~ '^_')
 ORDER BY t.typname, a.attnum
"""


@dataclass(frozen=True)
class Catalog:
    version: str
    functions: list[Function]
    types: dict[str, list[tuple[str, str]]]


def read_catalog(conninfo: str) -> Catalog:
    """The public functions and result types of the partition at ``conninfo``."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass('alk.alembic_version') IS NOT NULL").fetchone()
        if not found or not found[0]:
            raise RouterError(f"pyalk is not installed in the partition {conninfo!r}: run pyalk migrate there first")
        version_row = conn.execute("SELECT max(version_num) FROM alk.alembic_version").fetchone()
        functions = [Function(r[0], r[1], r[2], r[3], r[4], tuple(r[5])) for r in conn.execute(_FUNCTIONS)]
        types: dict[str, list[tuple[str, str]]] = {}
        for type_name, column, column_type in conn.execute(_TYPES):
            types.setdefault(type_name, []).append((column, column_type))
    return Catalog(str(version_row[0]) if version_row else "none", functions, types)


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _check_count(partitions: Sequence[str]) -> None:
    count = len(partitions)
    if count < 1 or count & (count - 1):
        raise RouterError(f"partitions: PL/Proxy needs a power of two of them (1, 2, 4, ...), got {count}")


def _server(partitions: Sequence[str]) -> str:
    _check_count(partitions)
    options = ", ".join(f"p{i} {_literal(conninfo)}" for i, conninfo in enumerate(partitions))
    return f"""CREATE EXTENSION IF NOT EXISTS plproxy;
DROP SERVER IF EXISTS alk CASCADE;
CREATE SERVER alk FOREIGN DATA WRAPPER plproxy OPTIONS ({options});
-- Credentials for the partitions: ALTER USER MAPPING FOR PUBLIC SERVER alk OPTIONS (ADD user 'u', ADD password 'p').
CREATE USER MAPPING FOR PUBLIC SERVER alk;
"""


# The hash both sides agree on: the first 4 bytes of sha256 of the UTF-8
# name, as a signed int4. PL/Proxy takes the partition as hash & (count - 1).
# A NULL name hashes as '': its partition refuses it as one server would.
_ROUTING = """CREATE SCHEMA alk;
COMMENT ON SCHEMA alk IS 'pyalk router (PL/Proxy): every alk.* function runs on the partition of its name.';

CREATE FUNCTION alk._partition_hash(name text) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN ('x' || substr(encode(sha256(convert_to(coalesce(name, ''), 'UTF8')), 'hex'), 1, 8))::bit(32)::integer;

CREATE FUNCTION alk._partition_count() RETURNS integer
LANGUAGE sql STABLE
RETURN (SELECT count(*) FROM pg_catalog.pg_foreign_server s, unnest(s.srvoptions) AS o(opt)
         WHERE s.srvname = 'alk' AND o.opt ~ '^p[0-9]+=');

CREATE FUNCTION alk.partition_of(name text) RETURNS integer
LANGUAGE sql STABLE
RETURN alk._partition_hash(name) & (alk._partition_count() - 1);
COMMENT ON FUNCTION alk.partition_of(text) IS
'The partition (0 .. count-1) that holds the queue, stream, lock, schedule or outbox called name.';

CREATE FUNCTION alk.partition_conninfo(name text) RETURNS text
LANGUAGE sql STABLE
RETURN (SELECT substr(o.opt, length('p' || alk.partition_of(name) || '=') + 1)
          FROM pg_catalog.pg_foreign_server s, unnest(s.srvoptions) AS o(opt)
         WHERE s.srvname = 'alk' AND o.opt LIKE 'p' || alk.partition_of(name) || '=%');
COMMENT ON FUNCTION alk.partition_conninfo(text) IS
'The conninfo of the partition that holds name (without the user mapping''s credentials): a worker LISTENs there.';

CREATE FUNCTION alk._route_job(queue text) RETURNS integer
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF queue IS NULL THEN
        RAISE EXCEPTION 'queue must be given through the router: job ids are unique per partition only'
            USING ERRCODE = 'LK002', HINT = 'pass queue => the job''s queue';
    END IF;
    RETURN alk._partition_hash(queue);
END
$$;
"""

# tick: every partition fires its own schedules (they live on the partition
# of their name) and enqueues locally; then the jobs of schedules whose queue
# lives elsewhere are forwarded there: enqueue a copy on the queue's partition,
# then cancel the original, and if that cancel lost (a concurrent tick moved
# it) cancel the copy. A router that dies between the two leaves the original,
# which the next tick forwards again: a fired job is never lost, and runs twice
# only after such a crash.
_CUSTOM = {
    "tick": """LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    clock bigint := alk.now();
    fired record;
    moved jsonb := '{}';
    source record;
    job alk.job;
    copy_id bigint;
    after bigint;
    seen integer;
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS alk_tick_fired
        (schedule_name text, queue text, fire_at bigint, job_id bigint) ON COMMIT DROP;
    INSERT INTO alk_tick_fired SELECT * FROM alk._all_tick(tick.now);
    FOR source IN
        SELECT DISTINCT alk.partition_of(s.name) AS part, s.queue FROM alk._all_list_schedules() s
         WHERE alk.partition_of(s.name) <> alk.partition_of(s.queue)
    LOOP
        after := NULL;
        LOOP
            seen := 0;
            FOR job IN SELECT * FROM alk._on_list_jobs(source.part, source.queue, 'pending', 1000, after) LOOP
                seen := seen + 1;
                after := job.id;
                copy_id := alk.enqueue(queue => job.queue, payload => job.payload, run_at => job.run_at,
                    priority => job.priority, max_attempts => job.max_attempts,
                    expires => CASE WHEN job.expires_at IS NOT NULL THEN greatest(least(
                        job.expires_at::numeric - clock, 9223372036854775807), -9223372036854775808)::bigint END,
                    visibility_timeout_s => job.visibility_timeout_s, backoff_base_s => job.backoff_base_s,
                    dead_letter_retention_s => job.dead_letter_retention_s);
                IF alk._on_cancel(source.part, job.queue, job.id) THEN
                    moved := moved || jsonb_build_object(source.part || ':' || job.id, copy_id);
                ELSE
                    PERFORM alk.cancel(job.queue, copy_id);
                END IF;
            END LOOP;
            EXIT WHEN seen < 1000;
        END LOOP;
    END LOOP;
    RETURN QUERY
        SELECT f.schedule_name, f.queue, f.fire_at,
               CASE WHEN alk.partition_of(f.schedule_name) = alk.partition_of(f.queue) THEN f.job_id
                    ELSE (moved ->> (alk.partition_of(f.schedule_name) || ':' || f.job_id))::bigint END
          FROM alk_tick_fired f
         ORDER BY f.schedule_name, f.fire_at;
    DROP TABLE alk_tick_fired;
END
$$""",
}

# scheduler_tick: the lease alk:scheduler lives on the partition of its name.
# There the lease and that partition's tick are one transaction, and a
# partition's LK004 (another owner leads) reaches the caller before anything
# else fires. Then tick runs as above for every partition; the rows the lease's
# partition fired go into tick's table first, so tick forwards and reports
# them with the rest.
_CUSTOM["scheduler_tick"] = """LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    CREATE TEMP TABLE IF NOT EXISTS alk_tick_fired
        (schedule_name text, queue text, fire_at bigint, job_id bigint) ON COMMIT DROP;
    INSERT INTO alk_tick_fired
        SELECT * FROM alk._lead_scheduler_tick('alk:scheduler', scheduler_tick.owner, scheduler_tick.ttl);
    RETURN QUERY SELECT * FROM alk.tick();
END
$$"""

#: A custom function's own proxies, instead of the default _all_<name>.
_CUSTOM_PROXIES = {
    "scheduler_tick": """CREATE FUNCTION alk._lead_scheduler_tick(lease text, owner text, ttl bigint)
RETURNS TABLE (schedule_name text, queue text, fire_at bigint, job_id bigint) LANGUAGE plproxy
AS $$ CLUSTER 'alk'; RUN ON alk._partition_hash(lease);
SELECT * FROM alk.scheduler_tick(owner, ttl); $$;
""",
}

#: Proxies on one partition by number, for tick's forwarding.
_ON_PARTITION = """CREATE FUNCTION alk._on_list_jobs(part integer, queue text, state text, n bigint, after_id bigint)
RETURNS SETOF alk.job LANGUAGE plproxy
AS $$ CLUSTER 'alk'; RUN ON part; SELECT * FROM alk.list_jobs(queue, state, n, after_id); $$;

CREATE FUNCTION alk._on_cancel(part integer, queue text, job_id bigint)
RETURNS boolean LANGUAGE plproxy
AS $$ CLUSTER 'alk'; RUN ON part; SELECT alk.cancel(queue, job_id); $$;
"""


def _setof(function: Function) -> str:
    """The result as a set (RUN ON ALL needs one)."""
    return function.result if function.returns_set else f"SETOF {function.result}"


def _proxy(name: str, arguments: str, result: str, run_on: str, body: str = "") -> str:
    return (
        f"CREATE FUNCTION alk.{name}({arguments})\nRETURNS {result} LANGUAGE plproxy\n"
        f"AS $$ CLUSTER 'alk'; RUN ON {run_on};{body} $$;\n"
    )


def _remote_call(function: Function) -> str:
    return f" SELECT * FROM alk.{function.name}({function.call_arguments});"


def _queue_or_all(function: Function) -> str:
    """A boolean about one worker: on its queue's partition, or, without the
    queue, on every partition with the answers combined by bool_or (true if
    any partition says true; NULL, the worker unknown, if all say NULL)."""
    if function.returns_set or function.result != "boolean" or "queue" not in function.in_names:
        raise RouterError(f"alk.{function.name}: route 'queue_or_all' needs a boolean function with a queue argument")
    call = f" SELECT alk.{function.name}({function.call_arguments});"
    every = _proxy(f"_all_{function.name}", function.arguments, "SETOF boolean", "ALL", call)
    one = _proxy(f"_one_{function.name}", function.arguments, "boolean", "alk._partition_hash(queue)", call)
    body = (f"IF queue IS NULL THEN\n        RETURN (SELECT bool_or(answer) FROM alk._all_{function.name}("
            f"{function.call_arguments}) AS answer);\n    END IF;\n"
            f"    RETURN alk._one_{function.name}({function.call_arguments});")
    return (every + one + f"CREATE FUNCTION alk.{function.name}({function.arguments})\nRETURNS boolean "
            f"LANGUAGE plpgsql\nAS $$\n#variable_conflict use_variable\nBEGIN\n    {body}\nEND\n$$;\n")


def _function(function: Function) -> str:
    """The router side of one function."""
    route = function.route()
    signature = f"alk.{function.name}({function.arguments})"
    if route.startswith("hash:"):
        argument = route.split(":", 1)[1]
        return _proxy(function.name, function.arguments, function.result, f"alk._partition_hash({argument})")
    if route.startswith("job:"):
        return _proxy(function.name, function.arguments, function.result, "alk._route_job(queue)")
    if route == "any":
        return _proxy(function.name, function.arguments, function.result, "ANY")
    if route == "local":
        return ""
    if route == "queue_or_all":
        return _queue_or_all(function)
    if route == "custom":
        # The custom body calls the function on every partition through _all_<name>.
        every = _CUSTOM_PROXIES.get(function.name) or _proxy(
            f"_all_{function.name}", function.arguments, _setof(function), "ALL", _remote_call(function))
        return every + f"\nCREATE FUNCTION {signature}\nRETURNS {function.result}\n{_CUSTOM[function.name]};\n"
    # all / hash_or_all: a proxy on every partition, and a wrapper that
    # sorts the concatenation (PL/Proxy returns partition after partition).
    parts = [_proxy(f"_all_{function.name}", function.arguments, _setof(function), "ALL", _remote_call(function))]
    # Two columns: a name, then what orders one name's rows (a consumer, a bucket).
    merged = f"SELECT * FROM alk._all_{function.name}({function.call_arguments}) ORDER BY 1, 2"
    if route == "all":
        body = f"RETURN QUERY {merged};"
    elif route == "hash_or_all":
        first = function.in_names[0]
        parts.append(_proxy(f"_one_{function.name}", function.arguments, function.result,
                            f"alk._partition_hash({first})", _remote_call(function)))
        body = (f"IF {first} IS NULL THEN\n        RETURN QUERY {merged};\n    ELSE\n"
                f"        RETURN QUERY SELECT * FROM alk._one_{function.name}({function.call_arguments});\n"
                "    END IF;")
    else:
        raise RouterError(f"alk.{function.name}: unknown route {route!r} in pyalk.schema.router.ROUTES")
    if not function.returns_set:
        raise RouterError(f"alk.{function.name}: route {route!r} needs a set-returning function")
    parts.append(f"CREATE FUNCTION {signature}\nRETURNS {function.result} LANGUAGE plpgsql\n"
                 f"AS $$\n#variable_conflict use_variable\nBEGIN\n    {body}\nEND\n$$;\n")
    return "\n".join(parts)


def _types(catalog: Catalog) -> str:
    return "".join(
        f"CREATE TYPE alk.{name} AS ({', '.join(f'{column} {kind}' for column, kind in columns)});\n"
        for name, columns in sorted(catalog.types.items())
    )


def router_script(catalog: Catalog, partitions: Sequence[str]) -> str:
    """The router install for ``partitions`` (conninfos, partition 0 first)."""
    parts = [
        f"-- pyalk router install (PL/Proxy), generated from a partition at version {catalog.version}.",
        "-- Run on the router database as a superuser: psql -v ON_ERROR_STOP=1 -f <file>.",
        "BEGIN;",
        _server(partitions),
        "DROP SCHEMA IF EXISTS alk CASCADE;",
        _ROUTING,
        _types(catalog),
        *(_function(f) for f in catalog.functions),
        _ON_PARTITION,
        "REVOKE ALL ON ALL FUNCTIONS IN SCHEMA alk FROM PUBLIC;",
        "COMMIT;",
        "",
    ]
    return "\n".join(parts)


def router_install(partitions: Sequence[str]) -> str:
    """Read partition 0's catalog and return the router install (``pyalk sql --router``)."""
    _check_count(partitions)
    return router_script(read_catalog(partitions[0]), partitions)

