"""What-if sweep keys: parse ``--sweep KEY=V1,V2,...``, build the grid, and derive each point's inputs.

A key is either global (``global_batch``, ``seq_len``) or a field of a device group (``count``, ``node``,
``inter_node_bandwidth_GBps``, ``price_per_node_hour``). A group field may be prefixed with the group's name
(``dgx-h100.count``) to change one group of a mixed cluster; without a prefix it changes every group.

Nothing here plans: a point is the base inputs with one set of values applied, and every point is derived
from the unchanged base cluster (a stage never mutates its input).
"""

from __future__ import annotations

import itertools
import logging
from numbers import Real
from dataclasses import dataclass, replace
from typing import Mapping, Protocol, Sequence, Union

from planner.assignments import split_assignments
from planner.errors import ClusterError, ConfigError, suggest
from planner.hardware.cluster import renumber, with_overrides
from planner.hardware.documents import RANGES
from planner.types import MAX_GLOBAL_BATCH, MAX_INPUT_DIM, Cluster, DeviceGroup, DeviceProfile, NodeProfile

Value = Union[int, float, str]
log = logging.getLogger(__name__)

#: group fields a sweep can change, with a one-line description for messages and ``--help``
GROUP_FIELDS: Mapping[str, str] = {
    "count": "number of nodes in the group (0 removes it)",
    "node": "node profile name from the catalog ('planner devices'); the group's own link overrides still hold",
    "device": "device name from the catalog: the group's nodes keep their links but get this device",
    "inter_node_bandwidth_GBps": "per-node network bandwidth, GB/s each way",
    "price_per_node_hour": "price of one node for one hour",
}
#: global fields a sweep can change
GLOBAL_FIELDS: Mapping[str, str] = {
    "global_batch": "samples per iteration",
    "seq_len": "sequence length (re-imports the model with --dim seq=V)",
}
SEQ_DIM = "seq"


class Catalog(Protocol):
    """What the sweep needs of ``planner.hardware.catalog`` (tests pass a fake)."""

    def get_node(self, name: str) -> NodeProfile: ...

    def get_device(self, name: str) -> DeviceProfile: ...


def valid_keys_text() -> str:
    """The valid keys, as one phrase for error messages and help."""
    group = ", ".join(f"[GROUP.]{name}" for name in GROUP_FIELDS)
    return f"{', '.join(GLOBAL_FIELDS)}, {group}"


@dataclass(frozen=True)
class SweepKey:
    """One swept quantity. ``group`` is the group prefix as written (None: global, or every group)."""

    text: str  # as the user wrote it, the column name in every output
    field: str
    group: str | None = None


@dataclass(frozen=True)
class Sweep:
    key: SweepKey
    values: tuple[Value, ...]


@dataclass(frozen=True)
class PointInputs:
    """The inputs of one grid point. ``reason`` is set (and ``cluster`` is None) when the point cannot be
    planned at all, e.g. every group's count is 0."""

    settings: tuple[tuple[str, Value], ...]
    cluster: Cluster | None
    global_batch: int
    dims: tuple[tuple[str, int], ...]
    reason: str = ""


# ----------------------------------------------------------------------------------------------- parsing


def parse_key(text: str) -> SweepKey:
    """``count`` / ``dgx-h100.count`` / ``seq_len`` -> SweepKey; unknown fields raise ConfigError."""
    stripped = text.strip()
    if stripped in GLOBAL_FIELDS:
        return SweepKey(stripped, stripped)
    group, dot, field = stripped.rpartition(".")
    if field in GROUP_FIELDS and (not dot or group):
        return SweepKey(stripped, field, group if dot else None)
    known = [*GLOBAL_FIELDS, *GROUP_FIELDS]
    raise ConfigError(f"--sweep: unknown key {stripped!r}{suggest(field or stripped, known)}; valid keys: "
                      f"{valid_keys_text()}")


def _int_value(key: SweepKey, text: str, minimum: int, maximum: int | None = None) -> int:
    if len(text) > 20:  # int() of thousands of digits is refused or slow; no count has 20
        raise ConfigError(f"--sweep {key.text}: {text[:20]}... has over 20 digits; give a smaller integer")
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"--sweep {key.text}: {text!r} is not an integer") from None
    if maximum is not None and value > maximum:
        raise ConfigError(f"--sweep {key.text}: {value} must be from {minimum} to {maximum}")
    if value < minimum:
        raise ConfigError(f"--sweep {key.text}: {value} must be at least {minimum}")
    return value


def _float_value(key: SweepKey, text: str, positive: bool, maximum: float) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"--sweep {key.text}: {text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")) or value < 0 or (positive and value == 0):
        raise ConfigError(f"--sweep {key.text}: {text!r} must be a {'positive' if positive else 'non-negative'} "
                          "finite number")
    if value > maximum:
        raise ConfigError(f"--sweep {key.text}: {text!r} must be at most {maximum:g}, as in a cluster file")
    return value


def parse_value(key: SweepKey, text: str) -> Value:
    text = text.strip()
    if not text:
        raise ConfigError(f"--sweep {key.text}: empty value; write e.g. --sweep {key.text}=1,2,4")
    if key.field == "count":  # the limits of a cluster file (planner.hardware.documents.RANGES)
        return _int_value(key, text, 0, int(RANGES["nodes"][1]))
    if key.field == "global_batch":
        return _int_value(key, text, 1, MAX_GLOBAL_BATCH)
    if key.field == "seq_len":
        return _int_value(key, text, 1, MAX_INPUT_DIM)  # the model's limit, said before any import
    if key.field == "inter_node_bandwidth_GBps":
        return _float_value(key, text, positive=True, maximum=RANGES["link_bandwidth_GBps"][1])
    if key.field == "price_per_node_hour":
        return _float_value(key, text, positive=False, maximum=RANGES["price_per_node_hour"][1])
    return text  # node, device: checked against the catalog before any point is planned


def parse_sweeps(sweeps: Mapping[str, Sequence[str]]) -> tuple[Sweep, ...]:
    """Keys in the mapping's order, values in the order given (that fixes the grid's order)."""
    if not isinstance(sweeps, Mapping):
        raise ConfigError(f"sweeps: got a {type(sweeps).__name__}; give a mapping of KEY to its values, e.g. "
                          "{'count': ['2', '4']}")
    if not sweeps:
        raise ConfigError(f"--sweep: give at least one KEY=V1,V2,... (valid keys: {valid_keys_text()})")
    parsed: list[Sweep] = []
    for text, values in sweeps.items():
        if not isinstance(text, str):
            raise ConfigError(f"sweeps: key {text!r} must be a name such as 'count' (valid keys: {valid_keys_text()})")
        key = parse_key(text)
        if isinstance(values, str):
            values = values.split(",")
        if not isinstance(values, (list, tuple)):
            raise ConfigError(f"--sweep {key.text}: got a {type(values).__name__}; give a list of values or 'A,B,C'")
        if not values:
            raise ConfigError(f"--sweep {key.text}: give at least one value")
        typed = tuple(parse_value(key, _value_text(key, v)) for v in values)
        if len(set(typed)) != len(typed):
            raise ConfigError(f"--sweep {key.text}: a value is repeated in {','.join(map(str, values))}")
        parsed.append(Sweep(key, typed))
    return tuple(parsed)


def _value_text(key: SweepKey, value: object) -> str:
    """A sweep value as the text the CLI would give (a number from Python written as it prints)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Real) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"--sweep {key.text}: value {value!r} must be a number or its text")


def parse_sweep_args(items: Sequence[str]) -> dict[str, list[str]]:
    """``["count=1,2", "seq_len=1024"]`` (the repeated CLI flag) -> ordered mapping; a key given twice is
    an error, since the grid would be ambiguous."""
    pairs = split_assignments(items, "--sweep", "KEY=V1,V2,...", "count=2,4,8",
                              once="list all its values in one flag (KEY=A,B,C)")
    return {name: values.split(",") for name, values in pairs}


# ----------------------------------------------------------------------------------------------- clusters


def with_groups(cluster: Cluster, groups: Sequence[DeviceGroup]) -> Cluster:
    """``cluster`` with its groups replaced: empty groups dropped, device ids renumbered, and named by its
    nodes in the shorthand (``dgx-h100*2+dgx-a100-80gb*4``), so a message about the point names what it has."""
    kept = renumber([g for g in groups if g.count > 0])
    # a group whose node kept its name but got another device (a ``device`` sweep) shows that device
    swapped = {new.name for new, old in zip(groups, cluster.groups)
               if new.node.name == old.node.name and new.node.device != old.node.device}
    return replace(cluster, groups=kept, name="+".join(
        f"{g.node.name}[{g.node.device.name}]*{g.count}" if g.name in swapped else f"{g.node.name}*{g.count}"
        for g in kept))


def _group_indices(cluster: Cluster, key: SweepKey) -> list[int]:
    if key.group is None:
        return list(range(len(cluster.groups)))
    by_name = [i for i, g in enumerate(cluster.groups) if g.name == key.group]
    if by_name:
        return by_name
    by_node = [i for i, g in enumerate(cluster.groups) if g.node.name == key.group]
    if len(by_node) == 1:
        return by_node
    names = sorted({g.name for g in cluster.groups} | {g.node.name for g in cluster.groups})
    if by_node:
        raise ConfigError(f"--sweep {key.text}: several groups use node {key.group!r}; name the group instead "
                          f"(groups: {', '.join(g.name for g in cluster.groups)})")
    raise ConfigError(f"--sweep {key.text}: the cluster has no group {key.group!r}{suggest(key.group, names)}; "
                      f"groups: {', '.join(g.name for g in cluster.groups)}")


def _set_field(group: DeviceGroup, field: str, value: Value, catalog: Catalog) -> DeviceGroup:
    if field == "count":
        return replace(group, count=int(value))
    if field == "node":  # the group's own link overrides (from its cluster file) hold for any node
        return replace(group, node=with_overrides(catalog.get_node(str(value)), group.link_overrides))
    if field == "device":
        return replace(group, node=replace(group.node, device=catalog.get_device(str(value))))
    if field == "inter_node_bandwidth_GBps":
        return replace(group, node=replace(group.node, inter_node_bandwidth_Bps=float(value) * 1e9))
    if field == "price_per_node_hour":
        return replace(group, price_per_node_hour=float(value))
    raise ValueError(f"not a group field: {field}")  # parse_key admits only GROUP_FIELDS


def check_groups(cluster: Cluster, sweeps: Sequence[Sweep], catalog: Catalog) -> None:
    """Raise ConfigError now, before any planning, for a group prefix the cluster lacks, two keys that set the
    same field of one group (``count`` and ``GROUP.count``: one would silently overwrite the other), or a
    node or device name the catalog lacks."""
    owner: dict[tuple[int, str], str] = {}
    for sweep in sweeps:
        if sweep.key.field in GROUP_FIELDS:
            for index in _group_indices(cluster, sweep.key):
                other = owner.setdefault((index, sweep.key.field), sweep.key.text)
                if other != sweep.key.text:
                    raise ConfigError(f"--sweep {other} and --sweep {sweep.key.text} both set the {sweep.key.field} "
                                      f"of group {cluster.groups[index].name!r}; keep one of them")
        if sweep.key.field in ("node", "device"):
            lookup = catalog.get_node if sweep.key.field == "node" else catalog.get_device
            for value in sweep.values:
                try:
                    lookup(str(value))
                except ClusterError as exc:
                    raise ConfigError(f"--sweep {sweep.key.text}: {exc}") from None


# fields applied before the others: a node replaces the profile a device or link change would edit
_APPLY_ORDER = {"node": 0, "device": 1}


def grid(sweeps: Sequence[Sweep]) -> list[tuple[tuple[str, Value], ...]]:
    """The cartesian product, first key slowest, values in the order given."""
    return [tuple((s.key.text, v) for s, v in zip(sweeps, combo))
            for combo in itertools.product(*(s.values for s in sweeps))]


def point_inputs(cluster: Cluster, global_batch: int, dims: Mapping[str, int], sweeps: Sequence[Sweep],
                 catalog: Catalog) -> list[PointInputs]:
    """Every grid point's cluster, batch and dims, derived from the base inputs: a group's node first (it
    replaces the whole node profile), then its device, then the rest, whatever the order of the flags.

    A group's price is for its own hardware: where a point swaps that for another node or device and no price
    is swept for the group, the group has no price there (the point has no cost), and one warning says so."""
    points: list[PointInputs] = []
    order = sorted(range(len(sweeps)), key=lambda i: _APPLY_ORDER.get(sweeps[i].key.field, 2))
    targets = [set(_group_indices(cluster, s.key)) if s.key.field in GROUP_FIELDS else set() for s in sweeps]
    priced_by_sweep = {i for s, t in zip(sweeps, targets) if s.key.field == "price_per_node_hour" for i in t}
    unpriced: dict[str, list[str]] = {}  # group name -> the hardware swapped in where it has no price
    for settings in grid(sweeps):
        groups = list(cluster.groups)
        batch = global_batch
        point_dims = dict(dims)
        for index, sweep, value in ((i, sweeps[i], settings[i][1]) for i in order):
            field = sweep.key.field
            if field == "global_batch":
                batch = int(value)
            elif field == "seq_len":
                point_dims[SEQ_DIM] = int(value)
            else:
                for i in targets[index]:
                    groups[i] = _set_field(groups[i], field, value, catalog)
        for i, (group, base) in enumerate(zip(groups, cluster.groups)):
            if base.price_per_node_hour is not None and i not in priced_by_sweep and _swapped(group, base):
                groups[i] = replace(group, price_per_node_hour=None)
                hardware = f"{group.node.name} ({group.node.device.name})"
                swaps = unpriced.setdefault(base.name, [])
                swaps += [hardware] if hardware not in swaps else []
        derived = with_groups(cluster, groups)
        reason = "" if derived.groups else "no nodes left (every group's count is 0)"
        points.append(PointInputs(settings=settings, cluster=derived if derived.groups else None,
                                  global_batch=batch, dims=tuple(sorted(point_dims.items())), reason=reason))
    if unpriced:
        groups_text = "; ".join(f"group {name!r} on {', '.join(swaps)}" for name, swaps in unpriced.items())
        log.warning("whatif: no cost where a priced group gets other hardware (%s): its price_per_node_hour is for "
                    "its own nodes; to price those points, sweep the price too, e.g. --sweep "
                    "%s.price_per_node_hour=P1,P2", groups_text, next(iter(unpriced)))
    return points


def _swapped(group: DeviceGroup, base: DeviceGroup) -> bool:
    """Whether ``group`` has other hardware than ``base``: another node, or another device in it."""
    return group.node.name != base.node.name or group.node.device != base.node.device
