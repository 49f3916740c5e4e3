"""Device allocation of a layout: which global devices each stage gets (shared by every backend and by
the plan builder, so the times the search bounds are those of the devices the plan names)."""

from __future__ import annotations

from planner.search.space import Layout, Settings
from planner.types import Cluster


def pool_offsets(cluster: Cluster) -> list[int]:
    """First global device id of each cluster group."""
    return [group.first_device for group in cluster.groups]


def first_devices(cluster: Cluster, layout: Layout, settings: Settings) -> list[int]:
    """Each stage's first device: stage k takes the next ``tp * dp`` devices of its pool, in order."""
    cursor = pool_offsets(cluster)
    out = []
    for option in layout.options:
        out.append(cursor[option.pool])
        cursor[option.pool] += option.ranks * settings.dp
    return out


def allocate(cluster: Cluster, layout: Layout, settings: Settings) -> list[tuple[int, ...]]:
    """Stage k takes the next ``tp * dp`` devices of its pool, in order (:func:`first_devices`); tp groups are
    contiguous and, because tp divides the node size, each lies inside one node."""
    return [tuple(range(first, first + option.ranks * settings.dp))
            for first, option in zip(first_devices(cluster, layout, settings), layout.options)]
