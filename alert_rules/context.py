"""The ``context`` annotation: what else was true when an intervene-now alert fired.

One builder for every alert, so pages read alike. Each part is a template query that Prometheus and the
embedded engine both run at the alert's evaluation time, scoped by the alert's own labels (``model_name``,
``instance``, ``gpu``) where the alert carries them; an absent label matches series without it, as in
PromQL. A missing series prints ``no data``, never an error::

    KV cache 97%; preemptions 0.167/s; waiting by reason: capacity=3 deferred=1;
    most errors: length bucket le2048 at 0.2/s; GPU memory used 94%; GPU throttle: sw_power_cap
"""

from __future__ import annotations

from alert_rules.slo import error_outcomes
from alert_rules.spec import any_of
from exporters.catalog.engine import ENGINE_PREEMPTIONS, ENGINE_WAITING_BY_REASON, KV_USAGE
from exporters.catalog.gpu import GPU_CLOCK_EVENT_ACTIVE, GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from exporters.catalog.request import REQUESTS

WINDOW = "5m"
"""The window of the rates shown (preemptions, errors by length bucket)."""
NO_DATA = "no data"
RATE = 'printf "%.3g"'
"""Rates per second print with 3 significant digits (0.167/s, not humanize's 166.7m/s)."""
ANNOTATION = "context"

MODEL_REPLICA = ("model_name", "instance")
"""Scope of per-replica alerts: one model on one sidecar."""
MODEL = ("model_name",)
"""Scope of fleet alerts (summed over instances): GPUs are those of the sidecars serving the model."""
REPLICA = ("instance",)
"""Scope of alerts about one sidecar's host or upstream process."""


def _go_raw(text: str) -> str:
    if "`" in text:
        raise ValueError(f"a query cannot contain a backtick: {text!r}")
    return f"`{text}`"


class _Scoped:
    """Query texts scoped by some of the alert's labels, as printf pipelines."""

    def __init__(self, scope: tuple[str, ...]) -> None:
        self.scope = scope

    def matchers(self, labels: tuple[str, ...], extra: str = "") -> tuple[str, tuple[str, ...]]:
        names = tuple(name for name in self.scope if name in labels)
        body = ", ".join([*(f"{name}=%q" for name in names), *([extra] if extra else [])])
        return (f"{{{body}}}" if body else ""), tuple(f"$labels.{name}" for name in names)

    def query(self, fmt: str, args: tuple[str, ...]) -> str:
        if not args:
            return f"query {_go_raw(fmt)}"
        return f"printf {_go_raw(fmt)} {' '.join(args)} | query"


def _one(source: str, name: str, shown: str, suffix: str = "") -> str:
    """``name VALUE`` from the first sample of a query, ``name: no data`` when it returns nothing."""
    return f"{{{{ with {source} }}}}{name} {{{{ . | first | value | {shown} }}}}{suffix}" \
           f"{{{{ else }}}}{name}: {NO_DATA}{{{{ end }}}}"


def context_template(scope: tuple[str, ...]) -> str:
    """The context annotation of an alert whose output carries the labels in ``scope``."""
    q = _Scoped(scope)
    model_sel, model_args = q.matchers(("model_name", "instance"))
    kv = q.query(f"max({KV_USAGE.series}{model_sel})", model_args)
    preempt = q.query(f"sum(rate({ENGINE_PREEMPTIONS.series}{model_sel}[{WINDOW}]))", model_args)
    waiting = q.query(f"sum by (reason) ({ENGINE_WAITING_BY_REASON.series}{model_sel})", model_args)
    bad = f'outcome=~"{any_of(error_outcomes())}"'
    err_sel, err_args = q.matchers(("model_name", "instance"), bad)
    errors = q.query(
        f"topk(1, sum by (length_bucket) (rate({REQUESTS.series}{err_sel}[{WINDOW}])) > 0)", err_args)
    gpu_sel, gpu_args = q.matchers(("instance", "gpu"))
    used, total, clock = GPU_MEMORY_USED.series, GPU_MEMORY_TOTAL.series, GPU_CLOCK_EVENT_ACTIVE.series
    if "model_name" in scope and "instance" not in scope:
        # Fleet alerts: the GPUs of the sidecars (instances) that report the model's KV cache.
        join = f" and on (instance) group by (instance) ({KV_USAGE.series}{model_sel})"
        memory = q.query(f"max(({used} / {total}){join})", model_args)
        clocks = q.query(f"count({clock}{join})", model_args)
        active = q.query(f"group by (reason) (({clock} == 1){join})", model_args)
    else:
        memory = q.query(f"max({used}{gpu_sel} / {total}{gpu_sel})", gpu_args * 2)
        clocks = q.query(f"count({clock}{gpu_sel})", gpu_args)
        active = q.query(f"group by (reason) ({clock}{gpu_sel} == 1)", gpu_args)
    parts = [
        _one(kv, "KV cache", "humanizePercentage"),
        _one(preempt, "preemptions", RATE, "/s"),
        f"waiting by reason:{{{{ range {waiting} | sortByLabel `reason` }}}} {{{{ .Labels.reason }}}}="
        f"{{{{ .Value | humanize }}}}{{{{ else }}}} {NO_DATA}{{{{ end }}}}",
        f"most errors:{{{{ with {errors} }}}}{{{{ with . | first }}}} length bucket {{{{ .Labels.length_bucket }}}} "
        f"at {{{{ .Value | {RATE} }}}}/s{{{{ end }}}}{{{{ else }}}} none in {WINDOW}{{{{ end }}}}",
        _one(memory, "GPU memory used", "humanizePercentage"),
        f"GPU throttle:{{{{ with {clocks} }}}}{{{{ range {active} | sortByLabel `reason` }}}} "
        f"{{{{ .Labels.reason }}}}{{{{ else }}}} none{{{{ end }}}}{{{{ else }}}} {NO_DATA}{{{{ end }}}}",
    ]
    return "; ".join(parts)


def context(scope: tuple[str, ...]) -> dict[str, str]:
    """The annotations to add to an alert: ``{"context": ...}``."""
    return {ANNOTATION: context_template(scope)}


__all__ = ["ANNOTATION", "MODEL", "MODEL_REPLICA", "NO_DATA", "REPLICA", "context", "context_template"]
