"""The sweep's failure and recovery settings: parsed, checked against the run and its strategy, normalized.

    failures = { schedule = [{ rank = 2, step = 5 }] }        # rank 2 dies during step 5 (0-based)
    failures = { schedule = [{ link = 2, step = 5, seconds = 1.5 }] }  # rank 2's NIC down 1.5 s from step 5
    failures = { mtbf = "7.9h", seed = 1 }                      # every worker: exponential, mean 7.9 h, seeded
    recovery = { mode = "checkpoint_restart", checkpoint_every = 10 }
    recovery = { mode = "elastic", rejoin_steps = 5 }           # also ps_shrink, reweight, none
    recovery = { mode = "survivors" }                           # each strategy's own: elastic, ps_shrink, reweight

Both go in [defaults] or a [grid] list. The whole point is checked before any work (strategies/faults.py says
which mode fits which strategy) and every problem is named with its value and what is accepted. The RunSpec holds
the normalized forms: failures {"schedule": [[step, rank], ...]} (rank failures; "outages": [[step, rank, seconds],
...] for links down, each key only where the schedule lists some) or {"mtbf_s": s, "seed": k}; recovery
{"mode": ..., "checkpoint_every": c, "rejoin_steps": r}.
"""

from __future__ import annotations

import math

import strategies.faults as faults
from experiments.config.settings import BY_NAME, is_int
from strategies.base import PARAMETERS, SERVER
from strategies.transport.link import parse_latency

MTBF_RANGE_S = (1.0, 1e9)  # one second to about 32 years, per worker
SEED_MAX = BY_NAME["failures.seed"].range.high
FAILURE_KEYS = ("schedule", "mtbf", "seed")
RECOVERY_KEYS = ("mode", "checkpoint_every", "rejoin_steps")
EXAMPLE_FAILURES = '{ schedule = [{ rank = 2, step = 5 }] } or { mtbf = "7.9h", seed = 1 }'
SURVIVORS = "survivors"  # the strategy family's own mode (_survivors)
EXAMPLE_RECOVERY = ('{ mode = "checkpoint_restart", checkpoint_every = 10 } (modes: ' + ", ".join(faults.MODES)
                    + f", or {SURVIVORS!r}: the strategy family's own)")
_UNITS = {"d": 86400.0, "day": 86400.0, "days": 86400.0, "h": 3600.0, "hour": 3600.0, "hours": 3600.0,
          "min": 60.0}


def check(point: dict, config, workers: int, steps: int, errors: list[str]) -> tuple[dict | None, dict | None]:
    """(failures, recovery) of a grid point, normalized; a line in `errors` for each problem."""
    raw_failures, raw_recovery = point.get("failures"), point.get("recovery")
    if raw_failures is None and raw_recovery is None:
        return None, None
    if raw_failures is None:
        errors.append(f"recovery = {raw_recovery!r} without failures: nothing to recover from; add failures = "
                      f"{EXAMPLE_FAILURES}")
        return None, None
    start = len(errors)
    raw_recovery = _survivors(raw_recovery, config, errors)
    servers = config.num_servers(workers)
    failures = _failures(raw_failures, workers, steps, servers, errors)
    recovery = _recovery(raw_recovery, errors)
    if len(errors) > start:
        return None, None
    schedule = [faults.Failure(step, rank) for step, rank in failures.get("schedule", [])]
    try:
        faults.check_fits(recovery.mode, config, workers, schedule)
    except faults.FaultSettingError as e:
        errors.append(str(e))
        return None, None
    return failures, {"mode": recovery.mode, "checkpoint_every": recovery.checkpoint_every,
                      "rejoin_steps": recovery.rejoin_steps}


def _survivors(value, config, errors: list[str]):
    """recovery.mode = "survivors": the strategy family's own way for the survivors to go on (elastic for an exact
    allreduce over send/recv, ps_shrink for a parameter server, reweight for decentralized averaging), so that one
    grid compares every family's own recovery; the run records the mode it stands for."""
    if not (isinstance(value, dict) and value.get("mode") == SURVIVORS):
        return value
    if config.role == SERVER:
        mode = faults.PS_SHRINK
    elif config.role == PARAMETERS and not config.exact:
        mode = faults.REWEIGHT
    elif config.name in faults.ELASTIC_STRATEGIES:
        mode = faults.ELASTIC
    else:
        errors.append(f"recovery.mode = 'survivors' with strategy {config.name!r}: its survivors cannot go on without "
                      f"a restart; it stands for elastic ({', '.join(faults.ELASTIC_STRATEGIES)}), ps_shrink "
                      f"(parameter_server) or reweight (decentralized); accepted here: checkpoint_restart, none")
        return value
    return {**value, "mode": mode}


def _failures(value, workers: int, steps: int, servers: int, errors: list[str]) -> dict:
    if not isinstance(value, dict) or not value or set(value) - set(FAILURE_KEYS):
        errors.append(f"failures = {value!r}: expected {EXAMPLE_FAILURES}")
        return {}
    if ("schedule" in value) == ("mtbf" in value):
        errors.append(f"failures = {value!r}: give either a schedule or an mtbf (per worker), not "
                      f"{'both' if 'schedule' in value else 'neither'}")
        return {}
    if "schedule" in value:
        if "seed" in value:
            errors.append(f"failures.seed = {value['seed']!r}: a schedule draws nothing; seed goes with mtbf")
            return {}
        return _schedule(value["schedule"], workers, steps, servers, errors)
    try:
        mtbf_s = parse_mtbf(value["mtbf"])
    except ValueError as e:
        errors.append(str(e))
        return {}
    seed = value.get("seed", 0)
    if (accepted := BY_NAME["failures.seed"]).problem(seed):
        errors.append(f"failures.seed = {seed!r}: accepted are {accepted.range.describe()}")
        return {}
    return {"mtbf_s": mtbf_s, "seed": seed}


def _schedule(rows, workers: int, steps: int, servers: int, errors: list[str]) -> dict:
    if not isinstance(rows, list) or not rows:
        errors.append(f"failures.schedule = {rows!r}: expected a non-empty list like [{{ rank = 2, step = 5 }}]")
        return {}
    listed = []
    outage_rows = [row for row in rows if isinstance(row, dict) and "link" in row]
    for row in rows:
        if isinstance(row, dict) and "link" in row:
            continue  # a link outage: _outages
        if not isinstance(row, dict) or set(row) != {"rank", "step"} or not all(
                is_int(row[k]) for k in row):
            errors.append(f"failures.schedule row {row!r}: expected {{ rank = <integer>, step = <integer> }} (a rank "
                          f"that fails) or {EXAMPLE_OUTAGE} (a link down)")
            return {}
        listed.append(faults.Failure(row["step"], row["rank"]))
    try:
        schedule = faults.check_schedule(listed, workers, steps, servers)
    except faults.FaultSettingError as e:
        errors.append(f"failures.schedule: {e}")
        return {}
    out = {"schedule": [[f.step, f.rank] for f in schedule]} if schedule else {}
    if outage_rows:
        outages = _outages(outage_rows, workers, steps, servers, errors)
        if outages is None:
            return {}
        out["outages"] = outages
    return out


EXAMPLE_OUTAGE = "{ link = <rank>, step = <integer>, seconds = <number> }"


def _outages(rows: list[dict], workers: int, steps: int, servers: int, errors: list[str]) -> list | None:
    """Schedule rows `{ link = r, step = s, seconds = t }` (rank r's NIC carries nothing for t s from the start of
    step s), normalized to [[step, rank, seconds], ...]; None after a line in `errors`."""
    listed = []
    for row in rows:
        if set(row) != {"link", "step", "seconds"} or not is_int(row["link"]) or not is_int(row["step"]):
            errors.append(f"failures.schedule row {row!r}: expected {EXAMPLE_OUTAGE}")
            return None
        listed.append(faults.LinkOutage(row["step"], row["link"], row["seconds"]))
    try:
        outages = faults.check_outages(listed, workers, steps, servers)
    except faults.FaultSettingError as e:
        errors.append(f"failures.schedule: {e}")
        return None
    return [[o.step, o.rank, o.seconds] for o in outages]


def _recovery(value, errors: list[str]):
    if value is None:
        return faults.Recovery(faults.NONE)
    if isinstance(value, dict) and "replicas" in value:
        errors.append(f"recovery.replicas = {value['replicas']!r}: chain-replicated servers run on the failure "
                      f"harness (`syncbench faults`), not yet in a sweep's training; a server's failure in a sweep is "
                      f"covered by recovery = {{ mode = \"checkpoint_restart\", checkpoint_every = <steps> }}")
        return None
    if not isinstance(value, dict) or set(value) - set(RECOVERY_KEYS) or "mode" not in value:
        errors.append(f"recovery = {value!r}: expected {EXAMPLE_RECOVERY}")
        return None
    try:
        return faults.Recovery(value["mode"], value.get("checkpoint_every", 0), value.get("rejoin_steps"))
    except faults.FaultSettingError as e:
        errors.append(str(e))
        return None


def parse_mtbf(value) -> float:
    """'7.9h', '30min', '2d', '90s' or a number of seconds -> seconds; ValueError naming the value and the range."""
    help_ = (f"a mean time between failures per worker from {MTBF_RANGE_S[0]:g} s to {MTBF_RANGE_S[1]:g} s, like "
             f"\"7.9h\", \"30min\", \"2d\", \"90s\" or seconds as a number")
    if isinstance(value, str) and (unit := next((u for u in sorted(_UNITS, key=len, reverse=True)
                                                 if value.strip().lower().endswith(u)), None)):
        try:
            seconds = float(value.strip().lower()[:-len(unit)]) * _UNITS[unit]
        except ValueError:
            raise ValueError(f"failures.mtbf = {value!r}: expected {help_}") from None
    else:
        try:
            seconds = parse_latency(value)  # seconds with s/ms/us units, or a bare number
        except (ValueError, TypeError):
            raise ValueError(f"failures.mtbf = {value!r}: expected {help_}") from None
    if isinstance(value, bool) or not math.isfinite(seconds) or not MTBF_RANGE_S[0] <= seconds <= MTBF_RANGE_S[1]:
        raise ValueError(f"failures.mtbf = {value!r}: accepted is {help_}")
    return seconds


COST_NAMES = {"detect": "detect_s", "restart": "restart_s", "checkpoint": "checkpoint_s", "reform": "reform_s",
              "rejoin": "rejoin_s"}


def parse_costs(text: str) -> dict[str, float]:
    """--costs 'detect=5,restart=60,...' -> FaultCosts' keyword arguments, each name and number checked."""
    costs = {}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        if key.strip() not in COST_NAMES:
            raise ValueError(f"--costs {text!r}: {key.strip()!r} is not one of {', '.join(COST_NAMES)}")
        try:
            costs[COST_NAMES[key.strip()]] = float(value)
        except ValueError:
            raise ValueError(f"--costs {text!r}: {value!r} is not a number of seconds") from None
    return costs
