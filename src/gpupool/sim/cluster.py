"""Simulated clusters: `--cluster 64x8`, `32x8:H100,32x8:A100`, `tiresias:n32g4.csv` or
`alibaba-openb:NODES.csv`, built once as immutable scheduler NodeViews. GPU models are spelled as the
product spells them (`input_files.gpu_models`: `32x8:h100` is H100), so that a trace's models match whatever
their case."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from gpupool.scheduler import GpuView, NodeView
from gpupool.sim.errors import SimError
from gpupool.sim.input_files import MIB, gpu_models, models_field, number_field, read_rows, whole_field

GIB = 1024**3
DEFAULT_MODEL = "GPU"  # a generic GPU: matches every request that names no model
# GPU memory by model, for requests with a memory floor; unknown models get 32 GiB.
GPU_MEMORY_GIB = {"H100": 80, "H200": 141, "A100": 80, "A800": 80, "A10": 24, "L4": 24, "L40": 48,
                  "V100": 32, "V100M32": 32, "V100M16": 16, "P100": 16, "T4": 16, "K80": 12, "G2": 32,
                  "G3": 32, "GPU": 32}  # fmt: skip
_GROUP = re.compile(r"^(?P<nodes>\d+)x(?P<gpus>\d+)(?::(?P<model>[A-Za-z][A-Za-z0-9_.\-]*))?$")
_SIZE = re.compile(r"^\d+x\d+$")  # a group's NODESxGPUS, before any `:MODEL`
CLUSTER_HELP = (
    "NODESxGPUS[:MODEL][,...] (e.g. 64x8 or 32x8:H100,32x8:A100), tiresias:FILE or alibaba-openb:FILE"
)


@dataclass(frozen=True, slots=True)
class Cluster:
    nodes: tuple[NodeView, ...]
    spec: str

    @property
    def gpus(self) -> int:
        return sum(len(n.gpus) for n in self.nodes)

    @property
    def max_gpus_per_node(self) -> int:
        return max((len(n.gpus) for n in self.nodes), default=0)


def gpu_node(name: str, gpus: int, model: str, cpus: float = 0.0, memory_bytes: int = 0,
             labels: tuple[tuple[str, str], ...] = ()) -> NodeView:  # fmt: skip
    memory = GPU_MEMORY_GIB.get(model.upper(), 32) * GIB
    views = tuple(GpuView(i, model, memory) for i in range(gpus))
    return NodeView(name, True, views, cpus=cpus, memory_bytes=memory_bytes, labels=labels)


def parse_groups(value: str, flag: str, first_index: int = 0, prefix: str = "node") -> list[NodeView]:
    """`32x8:H100,4x8` -> NodeViews named node-0, node-1, ... (from `first_index`); `32x8:h100` is H100."""
    nodes: list[NodeView] = []
    for part in value.split(","):
        match = _GROUP.match(part.strip())
        size, colon, model = part.strip().partition(":")
        if match is None and colon and _SIZE.match(size):
            example = f"{size}:H100"
            if not model:
                raise SimError(
                    flag, f"{part.strip()!r} names no GPU model after ':'; e.g. {example}, or {size}"
                )
            raise SimError(
                flag,
                f"{part.strip()!r}: GPU model {model!r} is not a model name (a letter, then letters, digits, "
                f"'_', '.' or '-'; one model a group); e.g. {example}",
            )
        if match is None:
            expected = "NODESxGPUS[:MODEL][,...], e.g. 4x8:H100" if flag == "--add" else CLUSTER_HELP
            raise SimError(flag, f"{part.strip()!r} is not NODESxGPUS[:MODEL]; expected {expected}")
        count, gpus = int(match["nodes"]), int(match["gpus"])
        if count <= 0 or gpus <= 0:
            raise SimError(flag, f"{part.strip()!r}: nodes and GPUs per node must be at least 1")
        model = gpu_models(match["model"])[0] if match["model"] else DEFAULT_MODEL
        for _ in range(count):
            nodes.append(gpu_node(f"{prefix}-{first_index + len(nodes)}", gpus, model))
    return nodes


def load_cluster(value: str, flag: str = "--cluster") -> Cluster:
    kind, sep, rest = value.partition(":")
    if flag == "--nodes" and not (sep and kind == "alibaba-openb"):
        raise SimError(
            "--nodes",
            f"{value!r}: --nodes takes an alibaba-openb node list (alibaba-openb:NODES.csv); give "
            f"--cluster {value} instead",
        )
    if sep and kind == "tiresias":
        return Cluster(_tiresias_nodes(Path(rest), flag), value)
    if sep and kind == "alibaba-openb":
        return Cluster(load_openb_nodes(Path(rest), flag), value)
    if sep and not _SIZE.match(kind.split(",")[0].strip()):  # `2x8:` and `2x8:H1:x` are parse_groups' to word
        raise SimError(flag, f"unknown cluster kind {kind!r}; expected {CLUSTER_HELP}")
    return Cluster(tuple(parse_groups(value, flag)), value)


TIRESIAS_COLUMNS = ("num_switch", "num_node_p_switch", "num_gpu_p_node")


def _tiresias_nodes(path: Path, flag: str) -> tuple[NodeView, ...]:
    """Tiresias' cluster file: one row of whole numbers, each 1 or more (`1,32,4`: 1 switch of 32 nodes of 4
    GPUs)."""
    rows = list(read_rows(path, "tiresias cluster", TIRESIAS_COLUMNS, flag))
    if not rows:
        raise SimError(flag, f"{path} has no cluster row")
    if len(rows) > 1:
        raise SimError(
            flag,
            f"{path} line 3: a second cluster row; a Tiresias cluster file has one (num_switch x "
            "num_node_p_switch nodes of num_gpu_p_node GPUs): delete the others",
        )
    switches, per_switch, gpus = (_at_least_1(rows[0], c, path, flag) for c in TIRESIAS_COLUMNS)
    nodes = []
    for s in range(switches):
        for n in range(per_switch):
            name = f"node-{s * per_switch + n}"
            nodes.append(gpu_node(name, gpus, DEFAULT_MODEL, labels=(("rack", f"switch-{s}"),)))
    return tuple(nodes)


def _at_least_1(row: dict[str, str], column: str, path: Path, flag: str) -> int:
    value = whole_field(row, column, path, 2, "switches, nodes and GPUs", flag)
    if value < 1:
        raise SimError(flag, f"{path} line 2: {column} {value} is below 1; give 1 or more (e.g. 1,32,4)")
    return value


OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")


def load_openb_nodes(path: Path, flag: str) -> tuple[NodeView, ...]:
    """An alibaba-openb node list (`sn,cpu_milli,memory_mib,gpu,model`); CPU-only nodes included; `gpu`
    whole, 0 or more."""
    nodes = []
    lines: dict[str, int] = {}  # node name -> its line
    for line, row in enumerate(read_rows(path, "alibaba-openb node list", OPENB_NODE_COLUMNS, flag), start=2):
        gpus = whole_field(row, "gpu", path, line, "GPUs", flag)
        if gpus < 0:
            raise SimError(flag, f"{path} line {line}: gpu {gpus} is negative; a node has 0 GPUs or more")
        name = row["sn"].strip() or f"node-{line}"
        if name in lines:
            raise SimError(
                flag,
                f"{path} line {line}: node {name!r} is listed twice (line {lines[name]} too); one row a node",
            )
        lines[name] = line
        models = models_field(row, "model", path, line, flag)
        if len(models) > 1:
            raise SimError(
                flag, f"{path} line {line}: model {row['model'].strip()!r} names several; give a node one"
            )
        nodes.append(
            gpu_node(
                name,
                gpus,
                models[0] if models else DEFAULT_MODEL,
                cpus=number_field(row, "cpu_milli", path, line, flag) / 1000.0,
                memory_bytes=int(number_field(row, "memory_mib", path, line, flag) * MIB),
            )
        )
    if not nodes:
        raise SimError(flag, f"{path} lists no nodes")
    return tuple(nodes)
