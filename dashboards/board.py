"""What every board shares: template variables, links, annotations and the dashboard itself."""

from __future__ import annotations

import re
from collections.abc import Sequence

from grafanalib import core

from dashboards.config import DashboardConfig
from dashboards.panels import DATASOURCE, Item, Spec, layout
from exporters.catalog import gpu, request, vllm
from exporters.catalog import prometheus as external

ON_TIME_RANGE_CHANGE = 2


def variables() -> list[core.Template]:
    """Every template variable, in the order they appear: datasource, model_name, instance, engine, gpu.

    ``instance`` is the scrape target Prometheus adds to every series of a replica's sidecar (and of a
    vLLM server it scrapes); all instances by default, so every panel shows the whole fleet.
    """
    return [
        core.Template(name="datasource", label="Data source", query="prometheus", type="datasource",
                      includeAll=False, multi=False),
        core.Template(
            name="model_name", label="Model", dataSource=DATASOURCE, multi=True, includeAll=True, allValue=".*",
            query=f"label_values({request.REQUESTS.series}, model_name)", refresh=ON_TIME_RANGE_CHANGE,
            default="$__all",
        ),
        core.Template(
            name="instance", label="Instance", dataSource=DATASOURCE, multi=True, includeAll=True, allValue=".*",
            query=f'label_values({request.REQUESTS.series}{{model_name=~"$model_name"}}, instance)',
            refresh=ON_TIME_RANGE_CHANGE, default="$__all",
        ),
        core.Template(
            name="engine", label="Engine", dataSource=DATASOURCE, multi=True, includeAll=True, allValue=".*",
            query=(f'label_values({vllm.NUM_REQUESTS_RUNNING.series}'
                   f'{{model_name=~"$model_name", instance=~"$instance"}}, engine)'),
            refresh=ON_TIME_RANGE_CHANGE, default="$__all",
        ),
        core.Template(
            name="gpu", label="GPU", dataSource=DATASOURCE, multi=True, includeAll=True, allValue=".*",
            query=f'label_values({gpu.GPU_INFO.series}{{instance=~"$instance"}}, gpu)', refresh=ON_TIME_RANGE_CHANGE,
            default="$__all",
        ),
    ]


def _refers(text: str, name: str) -> bool:
    return re.search(rf"\$\{{?{name}\b", text) is not None


def _used(name: str, items: Sequence[Item]) -> bool:
    return any(_refers(q.expr, name) for item in items if isinstance(item, Spec) for q in item.queries)


def templating(items: Sequence[Item]) -> core.Templating:
    """The datasource variable, the variables the board's queries use, and those their queries use."""
    every = variables()
    names = {"datasource"} | {t.name for t in every if _used(t.name, items)}
    while True:
        needed = {t.name for t in every for user in every
                  if user.name in names and _refers(str(user.query), t.name)} - names
        if not needed:
            break
        names |= needed
    return core.Templating(list=[t for t in every if t.name in names])


def alert_annotations() -> core.Annotations:
    """Firing alerts as annotations on every time-series panel."""
    return core.Annotations(list=[{
        "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": "red",
        "name": "Alerts firing", "expr": f'{external.ALERTS.series}{{alertstate="firing"}}',
        "step": "60s", "titleFormat": "{{alertname}}", "tagKeys": "severity,model_name",
        "useValueForTime": False,
    }])


def dashboard(config: DashboardConfig, key: str, title: str, description: str,
              items: Sequence[Item]) -> core.Dashboard:
    """A board with the house settings: stable uid ``<prefix>-<key>``, tags, links to its siblings."""
    links = [core.DashboardLink(
        title="inferwatch", type="dashboards", tags=list(config.tags[:1]), asDropdown=True,
        includeVars=True, keepTime=True,
    )]
    return core.Dashboard(
        title=title, uid=f"{config.uid_prefix}-{key}", description=description, tags=list(config.tags),
        panels=layout(items, config.panel_height), templating=templating(items), annotations=alert_annotations(),
        links=links, editable=False, refresh=config.refresh, time=core.Time(config.time_from, "now"),
        graphTooltip=1, timezone="browser",
    ).auto_panel_ids()


__all__ = ["alert_annotations", "dashboard", "templating", "variables"]
