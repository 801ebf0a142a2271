"""The SQL views and table macros over the projection tables (schema version 3).

They live apart from the projector because two places create them: migration 2 in a
projection database, and ``projections.parquet.open_parquet`` over an exported data lake,
so that every query works unchanged over both. Each statement is idempotent
(``CREATE OR REPLACE``) and reads only the tables, never another database.

Thresholds are constants here and documented in docs/sql.md; a query that wants another
threshold calls the macro form (``…_between``, ``…_after``, ``gpu_usage_by``) instead.
"""

from __future__ import annotations

__all__ = [
    "BUCKET_S",
    "HANDFUL",
    "NOISY_RATIO",
    "SAMPLE_HOLD_MS",
    "SHARE_VIEW_DDL",
    "SHARE_VIEW_NAMES",
    "SLO_MIN_JOBS",
    "SLO_RATIO",
    "SLO_WINDOW_S",
    "VIEW_DDL",
    "VIEW_NAMES",
    "WAIT_THRESHOLD_S",
]

SLO_RATIO = 1.5
"""The fairness SLO: a queue's p90 completion within 1.5 × its p50 over any 24 h window."""
NOISY_RATIO = 2.0
"""p90 above 2 × p50 flags a noisy neighbour."""
SLO_WINDOW_S = 86_400
"""Length of the rolling SLO window; windows end on every hour of ledger time."""
SLO_MIN_JOBS = 5
"""Fewer completions than this in a window leave the SLO flags NULL (not evaluated)."""
HANDFUL = 5
"""More preemptions than this per queue and week is "more than a handful"."""
WAIT_THRESHOLD_S = 600
"""``requested_not_allocated``: a wait for GPUs longer than this raises the alarm."""
BUCKET_S = 3600
"""``gpu_usage`` bucket: one hour of ledger time."""
SAMPLE_HOLD_MS = 300_000
"""A utilisation sample holds until the device's next sample, at most this long (the
Prometheus staleness window): a gap in monitoring is not counted as idle or busy."""

# The percentile aggregates of every job view (migration 1's views use this text too), so
# the windowed and tree forms mean exactly what ``tenant_percentiles`` means. Sums are
# taken over exact integer columns so the result does not depend on DuckDB's (parallel,
# unordered) summation order.
JOB_AGGREGATES = """
    count(*) AS jobs,
    count(time_to_ready_s) AS ready,
    count(completion_s) AS finished,
    count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
    count(*) FILTER (WHERE status = 'failed') AS failed,
    count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
    count(*) FILTER (WHERE status = 'unschedulable') AS unschedulable,
    count(*) FILTER (WHERE status IN ('pending', 'allocated', 'running')) AS active,
    quantile_cont(time_to_ready_s, 0.50) AS p50_ttr_s,
    quantile_cont(time_to_ready_s, 0.90) AS p90_ttr_s,
    quantile_cont(time_to_ready_s, 0.95) AS p95_ttr_s,
    quantile_cont(time_to_ready_s, 0.99) AS p99_ttr_s,
    quantile_cont(completion_s, 0.50) AS p50_completion_s,
    quantile_cont(completion_s, 0.90) AS p90_completion_s,
    quantile_cont(completion_s, 0.95) AS p95_completion_s,
    quantile_cont(completion_s, 0.99) AS p99_completion_s,
    CAST(coalesce(sum(preemptions), 0) AS BIGINT) AS preemptions,
    coalesce(sum(lost_gpu_ms), 0) / 3600000 AS lost_gpu_hours,
    coalesce(sum(gpu_milli), 0) / 1000 AS gpus_requested
"""

_ALL_TIME = "CAST('-infinity' AS DOUBLE), CAST('infinity' AS DOUBLE)"

# milli-GPU x ms -> GPU-hours
_GPU_HOURS = "3600000000.0"

VIEW_DDL: tuple[str, ...] = (
    # ---------------------------------------------------------------- percentiles
    f"""
    CREATE OR REPLACE MACRO tenant_percentiles_between(from_s, to_s) AS TABLE
    SELECT queue, queue_path, {JOB_AGGREGATES}
    FROM jobs
    WHERE submitted_at_s >= from_s AND submitted_at_s < to_s
    GROUP BY queue, queue_path
    """,  # noqa: S608  # built from module constants only
    f"""
    CREATE OR REPLACE MACRO tree_percentiles_between(from_s, to_s) AS TABLE
    WITH levels AS (
        SELECT *, unnest(range(1, len(string_split(queue_path, '/')) + 1)) AS level
        FROM jobs
        WHERE submitted_at_s >= from_s AND submitted_at_s < to_s
    )
    SELECT array_to_string(string_split(queue_path, '/')[1:level], '/') AS tree_path,
           level - 1 AS depth,
           {JOB_AGGREGATES}
    FROM levels
    GROUP BY 1, 2
    """,  # noqa: S608  # built from module constants only
    f"""
    CREATE OR REPLACE VIEW tree_percentiles AS
    SELECT * FROM tree_percentiles_between({_ALL_TIME})
    """,  # noqa: S608  # built from module constants only
    # ---------------------------------------------------------------- fairness SLO
    f"""
    CREATE OR REPLACE VIEW fairness_slo AS
    WITH done AS (
        SELECT queue, queue_path, finished_at_ms, completion_s
        FROM jobs WHERE completion_s IS NOT NULL
    ),
    ends AS (
        SELECT unnest(range(min(finished_at_ms) // 3600000 + 1,
                            max(finished_at_ms) // 3600000 + 2)) * 3600000 AS end_ms
        FROM done
    ),
    windows AS (
        SELECT d.queue, d.queue_path, e.end_ms,
               count(*) AS finished,
               quantile_cont(d.completion_s, 0.5) AS p50_completion_s,
               quantile_cont(d.completion_s, 0.9) AS p90_completion_s
        FROM ends e
        JOIN done d ON d.finished_at_ms >= e.end_ms - {SLO_WINDOW_S * 1000}
                   AND d.finished_at_ms < e.end_ms
        GROUP BY d.queue, d.queue_path, e.end_ms
    )
    SELECT queue, queue_path,
           (end_ms - {SLO_WINDOW_S * 1000}) / 1000 AS window_start_s,
           end_ms / 1000 AS window_end_s,
           finished, p50_completion_s, p90_completion_s,
           p90_completion_s / nullif(p50_completion_s, 0) AS ratio,
           CASE WHEN finished >= {SLO_MIN_JOBS}
                THEN p90_completion_s > {SLO_RATIO} * p50_completion_s END AS slo_breach,
           CASE WHEN finished >= {SLO_MIN_JOBS}
                THEN p90_completion_s > {NOISY_RATIO} * p50_completion_s END
                AS noisy_neighbour
    FROM windows
    """,  # noqa: S608  # built from module constants only
    """
    CREATE OR REPLACE VIEW fairness_slo_summary AS
    SELECT queue, queue_path,
           count(*) AS windows,
           count(*) FILTER (WHERE slo_breach IS NOT NULL) AS evaluated,
           count(*) FILTER (WHERE slo_breach) AS breached,
           count(*) FILTER (WHERE noisy_neighbour) AS noisy,
           max(ratio) FILTER (WHERE slo_breach IS NOT NULL) AS worst_ratio,
           min(window_end_s) FILTER (WHERE slo_breach) AS first_breach_end_s,
           max(window_end_s) FILTER (WHERE slo_breach) AS last_breach_end_s
    FROM fairness_slo
    GROUP BY queue, queue_path
    """,
    # ---------------------------------------------------------------- preemptions
    f"""
    CREATE OR REPLACE VIEW preemptions_weekly AS
    SELECT p.queue,
           coalesce(q.path, p.queue) AS queue_path,
           p.at_ms // 604800000 AS week,
           (p.at_ms // 604800000) * 604800 AS week_start_s,
           count(*) AS preemptions,
           count(*) FILTER (WHERE p.rule = 'reclaim') AS reclaims,
           count(*) FILTER (WHERE p.rule = 'preempt') AS preempts,
           count(*) FILTER (WHERE p.rule = 'backfill') AS backfills,
           count(*) FILTER (WHERE p.rule NOT IN ('reclaim', 'preempt', 'backfill'))
               AS other_rules,
           count(DISTINCT p.job) AS jobs_preempted,
           sum(p.lost_gpu_ms) / 3600000 AS lost_gpu_hours,
           string_agg(DISTINCT p.preemptor_queue, ',' ORDER BY p.preemptor_queue)
               AS preemptor_queues,
           {HANDFUL} AS handful,
           count(*) > {HANDFUL} AS more_than_a_handful
    FROM preemptions p
    LEFT JOIN queues q ON q.queue = p.queue
    GROUP BY p.queue, queue_path, week, week_start_s
    """,  # noqa: S608  # built from module constants only
    # ---------------------------------------------------------------- GPU usage
    f"""
    CREATE OR REPLACE MACRO gpu_usage_by(bucket_s) AS TABLE
    WITH clock AS (SELECT coalesce(max(at_ms), 0) AS end_ms FROM events),
    bucket AS (SELECT CAST(round(bucket_s * 1000) AS BIGINT) AS b),
    a AS (
        SELECT a.queue, a.node, a.devices, a.device_milli, a.gpu_milli, a.from_ms,
               a.started_ms,
               coalesce(a.to_ms, greatest(c.end_ms, a.from_ms)) AS to_ms
        FROM allocations a, clock c
        WHERE a.gpu_milli > 0
    ),
    ab AS (
        SELECT a.*, bk.b, unnest(range(a.from_ms // bk.b, (a.to_ms - 1) // bk.b + 1)) AS k
        FROM a, bucket bk
        WHERE a.to_ms > a.from_ms
    ),
    alloc AS (
        SELECT queue, k, b,
               sum(gpu_milli * (least(to_ms, (k + 1) * b) - greatest(from_ms, k * b)))
                   AS alloc_gms,
               sum(CASE WHEN started_ms IS NULL THEN 0 ELSE gpu_milli * greatest(0,
                   least(to_ms, (k + 1) * b) - greatest(started_ms, from_ms, k * b)) END)
                   AS run_gms
        FROM ab
        GROUP BY queue, k, b
    ),
    s AS (
        SELECT node, device, utilization_pct, at_ms AS s_from,
               least(coalesce(lead(at_ms) OVER (PARTITION BY node, device
                                                ORDER BY at_ms, "offset"),
                              at_ms + {SAMPLE_HOLD_MS}),
                     at_ms + {SAMPLE_HOLD_MS}) AS s_to
        FROM gpu_utilization
    ),
    ad AS (
        SELECT queue, node, from_ms, to_ms,
               unnest(devices) AS device, unnest(device_milli) AS milli
        FROM a
    ),
    ov AS (
        SELECT ad.queue, ad.milli, s.utilization_pct,
               greatest(ad.from_ms, s.s_from) AS o_from, least(ad.to_ms, s.s_to) AS o_to
        FROM ad
        JOIN s ON s.node = ad.node AND s.device = ad.device
              AND s.s_from < ad.to_ms AND s.s_to > ad.from_ms
    ),
    ovb AS (
        SELECT ov.*, bk.b, unnest(range(ov.o_from // bk.b, (ov.o_to - 1) // bk.b + 1)) AS k
        FROM ov, bucket bk
        WHERE ov.o_to > ov.o_from
    ),
    util AS (
        SELECT queue, k,
               sum(milli * (least(o_to, (k + 1) * b) - greatest(o_from, k * b)))
                   AS sampled_gms,
               sum(milli * utilization_pct
                   * (least(o_to, (k + 1) * b) - greatest(o_from, k * b))) / 100 AS util_gms
        FROM ovb
        GROUP BY queue, k
    )
    SELECT al.queue,
           coalesce(q.path, al.queue) AS queue_path,
           al.k AS bucket,
           al.k * al.b / 1000 AS bucket_start_s,
           al.b / 1000 AS bucket_s,
           al.alloc_gms / {_GPU_HOURS} AS allocated_gpu_hours,
           al.run_gms / {_GPU_HOURS} AS running_gpu_hours,
           (al.alloc_gms - al.run_gms) / {_GPU_HOURS} AS idle_gpu_hours,
           u.sampled_gms / {_GPU_HOURS} AS sampled_gpu_hours,
           u.util_gms / {_GPU_HOURS} AS utilised_gpu_hours,
           (u.sampled_gms - u.util_gms) / {_GPU_HOURS} AS drift_gpu_hours,
           u.util_gms / nullif(u.sampled_gms, 0) AS utilisation
    FROM alloc al
    LEFT JOIN util u ON u.queue = al.queue AND u.k = al.k
    LEFT JOIN queues q ON q.queue = al.queue
    """,  # noqa: S608  # built from module constants only
    f"""
    CREATE OR REPLACE VIEW gpu_usage AS SELECT * FROM gpu_usage_by({BUCKET_S})
    """,  # noqa: S608  # built from module constants only
    # ---------------------------------------------------------------- waiting for GPUs
    """
    CREATE OR REPLACE MACRO requested_not_allocated_after(threshold_s) AS TABLE
    WITH clock AS (SELECT coalesce(max(at_ms), 0) AS end_ms FROM events),
    first_alloc AS (
        SELECT j.job, min(a.from_ms) FILTER (WHERE a.gpu_milli > 0) AS first_ms
        FROM jobs j
        JOIN allocations a ON a.job = j.job AND a.allocated_offset >= j.submitted_offset
        GROUP BY j.job
    ),
    no_gpu AS (SELECT job, bool_or(ran_without_gpus) AS ran FROM pods GROUP BY job),
    waits AS (
        SELECT j.job, j.queue, j.queue_path, j.gpus, j.status, j.submitted_at_s,
               f.first_ms / 1000 AS first_allocated_at_s,
               (coalesce(f.first_ms, j.finished_at_ms, c.end_ms) - j.submitted_at_ms) / 1000
                   AS waited_s,
               f.first_ms IS NULL AS never_allocated,
               coalesce(n.ran, false) AS ran_without_gpus,
               j.unschedulable_reason
        FROM jobs j
        CROSS JOIN clock c
        LEFT JOIN first_alloc f ON f.job = j.job
        LEFT JOIN no_gpu n ON n.job = j.job
        WHERE j.gpu_milli > 0
    )
    SELECT * FROM waits WHERE waited_s > threshold_s OR ran_without_gpus
    """,
    f"""
    CREATE OR REPLACE VIEW requested_not_allocated AS
    SELECT * FROM requested_not_allocated_after({WAIT_THRESHOLD_S})
    """,  # noqa: S608  # built from module constants only
    # ---------------------------------------------------------------- throughput
    """
    CREATE OR REPLACE VIEW throughput AS
    WITH done AS (
        SELECT queue, queue_path, status, finished_at_ms, completion_s
        FROM jobs WHERE status IN ('succeeded', 'failed')
    ),
    periods AS (
        SELECT 'day' AS period, 86400000 AS span_ms, * FROM done
        UNION ALL
        SELECT 'week' AS period, 604800000 AS span_ms, * FROM done
    )
    SELECT period,
           finished_at_ms // span_ms AS period_index,
           (finished_at_ms // span_ms) * span_ms / 1000 AS period_start_s,
           queue, queue_path,
           count(*) AS finished,
           count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE status = 'failed') AS failed,
           quantile_cont(completion_s, 0.5) AS p50_completion_s
    FROM periods
    GROUP BY period, period_index, period_start_s, queue, queue_path
    """,
)
"""Every view and macro of schema version 2, in dependency order."""

VIEW_NAMES: tuple[tuple[str, str], ...] = (
    ("VIEW", "tree_percentiles"),
    ("VIEW", "fairness_slo_summary"),
    ("VIEW", "fairness_slo"),
    ("VIEW", "preemptions_weekly"),
    ("VIEW", "gpu_usage"),
    ("VIEW", "requested_not_allocated"),
    ("VIEW", "throughput"),
    ("MACRO TABLE", "tenant_percentiles_between"),
    ("MACRO TABLE", "tree_percentiles_between"),
    ("MACRO TABLE", "gpu_usage_by"),
    ("MACRO TABLE", "requested_not_allocated_after"),
)
"""(kind, name) of each object ``VIEW_DDL`` creates, dependants first, for dropping."""

SHARE_VIEW_DDL: tuple[str, ...] = (
    """
    CREATE OR REPLACE VIEW queue_shares_minutes AS
    SELECT m.minute, m.minute * 60000 AS at_ms, m.minute * 60.0 AS at_s,
           s.queue, s.parent,
           s.deserved_gpu_milli, s.fair_gpu_milli, s.allocated_gpu_milli,
           s.requested_gpu_milli, s.deserved_gpus, s.fair_gpus, s.allocated_gpus,
           s.requested_gpus, s.pending_jobs, s.running_jobs
    FROM queue_shares s, LATERAL (SELECT unnest(range(s.from_minute, s.to_minute)) AS minute) m
    """,
    """
    CREATE OR REPLACE MACRO queue_shares_between(from_s, to_s) AS TABLE
    WITH clipped AS (
        SELECT queue, parent,
               greatest(from_s, from_minute * 60.0) AS lo,
               least(to_s, to_minute * 60.0) AS hi,
               deserved_gpus, fair_gpus, allocated_gpus, requested_gpus,
               pending_jobs, running_jobs
        FROM queue_shares
        WHERE to_minute * 60.0 > from_s AND from_minute * 60.0 < to_s
    )
    SELECT queue, parent,
           min(lo) AS from_s, max(hi) AS to_s,
           sum((hi - lo) * deserved_gpus) / sum(hi - lo) AS deserved_gpus,
           sum((hi - lo) * fair_gpus) / sum(hi - lo) AS fair_gpus,
           sum((hi - lo) * allocated_gpus) / sum(hi - lo) AS allocated_gpus,
           sum((hi - lo) * requested_gpus) / sum(hi - lo) AS requested_gpus,
           sum((hi - lo) * pending_jobs) / sum(hi - lo) AS pending_jobs,
           sum((hi - lo) * running_jobs) / sum(hi - lo) AS running_jobs,
           sum((hi - lo) * allocated_gpus) / 3600 AS allocated_gpu_hours,
           sum((hi - lo) * fair_gpus) / 3600 AS fair_gpu_hours
    FROM clipped
    GROUP BY queue, parent
    """,
)
"""Views over the ``queue_shares`` intervals (schema version 3): ``queue_shares_minutes``
gives one row per queue per minute (filter it by ``minute`` or ``at_s``: a long ledger
has many); ``queue_shares_between(from_s, to_s)`` each queue's time-weighted averages and
GPU-hours over a window of ledger time."""

SHARE_VIEW_NAMES: tuple[tuple[str, str], ...] = (
    ("VIEW", "queue_shares_minutes"),
    ("MACRO TABLE", "queue_shares_between"),
)
"""(kind, name) of each object ``SHARE_VIEW_DDL`` creates, for dropping."""
