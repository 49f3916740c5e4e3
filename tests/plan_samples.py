"""Hand-made Plans for the export tests (the search is tested elsewhere): a uniform GPT plan, an uneven
one, a heterogeneous one with replica groups, and a DLRM plan with embedding tables."""

from __future__ import annotations

from planner.plans import (EmbeddingPlacement, EmbeddingShard, Plan, ReplicaPlan, SearchInfo, StagePlan)

BREAKDOWN = {"compute_s": 0.8, "tp_comm_s": 0.1, "pp_comm_s": 0.02, "dp_comm_s": 0.05, "bubble_s": 0.1,
             "optimizer_s": 0.01, "embedding_s": 0.0}
CLUSTER_2x8 = {"name": "dgx-a100-80gb*2", "num_devices": 16,
               "groups": [{"name": "dgx-a100-80gb", "node": "dgx-a100-80gb", "device": "a100-80gb",
                           "count": 2, "devices": 16, "first_device": 0}]}


def gpt_layers(blocks: int) -> tuple[list[str], list[str]]:
    names = ["embed"] + [f"h.{i}" for i in range(blocks)] + ["head"]
    kinds = ["embedding"] + ["block"] * blocks + ["head"]
    return names, kinds


def stages_from_split(counts: list[int], names: list[str], kinds: list[str], tp: int, dp: int,
                      devices_per_stage: int, recompute: str = "selective") -> tuple[StagePlan, ...]:
    stages, first = [], 0
    for index, count in enumerate(counts):
        last = first + count - 1
        devices = tuple(range(index * devices_per_stage, (index + 1) * devices_per_stage))
        stages.append(StagePlan(index=index, first_layer=first, last_layer=last,
                                layer_names=tuple(names[first:last + 1]), layer_kinds=tuple(kinds[first:last + 1]),
                                device_type="a100-80gb", devices=devices, tp=tp, dp=dp, recompute=recompute,
                                memory_bytes_per_device=40e9 + index, time_s=0.01 * (index + 1)))
        first = last + 1
    return tuple(stages)


def gpt_plan(counts: list[int] = (5, 5), tp: int = 4, dp: int = 2, vpp: int = 1, zero: int = 1,
             recompute: str = "selective", sequence_parallel: bool = True) -> Plan:
    names, kinds = gpt_layers(sum(counts) - 2)
    pp = len(counts)
    stages = stages_from_split(list(counts), names, kinds, tp, dp, tp * dp, recompute)
    nodes = -(-pp * tp * dp // 8)
    cluster = {"name": f"dgx-a100-80gb*{nodes}", "num_devices": 8 * nodes,
               "groups": [{**CLUSTER_2x8["groups"][0], "count": nodes, "devices": 8 * nodes}]}
    micro = 2
    return Plan(model={"name": "gpt-test", "params": 350_000_000, "flops_per_sample": 2.1e12, "seq_len": 2048},
                cluster=cluster, global_batch=64, micro_batch=micro, num_micro_batches=64 // (micro * dp),
                schedule="interleaved" if vpp > 1 else "1f1b", zero=zero, iteration_time_s=1.08,
                throughput_samples_per_s=64 / 1.08, stages=stages, breakdown=dict(BREAKDOWN),
                search=SearchInfo(time_s=0.5, candidates_evaluated=1234, proven_optimal=True, lower_bound_s=1.08,
                                  algorithm="stage DP"),
                vpp=vpp, sequence_parallel=sequence_parallel, memory_per_device_bytes=40e9 + 1,
                bottleneck="compute on stage 1 (a100-80gb) dominates.", physical_bound_s=0.7)


def mixed_plan() -> Plan:
    names, kinds = gpt_layers(6)
    stage0 = StagePlan(index=0, first_layer=0, last_layer=3, layer_names=tuple(names[:4]), layer_kinds=tuple(kinds[:4]),
                       device_type="a100-80gb", devices=tuple(range(8)), tp=4, dp=2, recompute="none",
                       memory_bytes_per_device=30e9, time_s=0.02)
    replicas = (ReplicaPlan("v100-32gb", tuple(range(8, 16)), tp=4, dp=2, batch_share=0.4,
                            memory_bytes_per_device=28e9, time_s=0.021),
                ReplicaPlan("a100-80gb", tuple(range(16, 24)), tp=4, dp=2, batch_share=0.6,
                            memory_bytes_per_device=31e9, time_s=0.02))
    stage1 = StagePlan(index=1, first_layer=4, last_layer=7, layer_names=tuple(names[4:]), layer_kinds=tuple(kinds[4:]),
                       device_type="mixed", devices=tuple(range(8, 24)), tp=4, dp=4, recompute="full",
                       memory_bytes_per_device=31e9, time_s=0.021, replicas=replicas)
    cluster = {"name": "mixed", "num_devices": 24,
               "groups": [{"name": "a", "device": "a100-80gb", "count": 1, "devices": 8, "first_device": 0},
                          {"name": "v", "device": "v100-32gb", "count": 1, "devices": 8, "first_device": 8},
                          {"name": "b", "device": "a100-80gb", "count": 1, "devices": 8, "first_device": 16}]}
    return Plan(model={"name": "gpt-mixed", "params": 10**8, "flops_per_sample": 1e11}, cluster=cluster,
                global_batch=32, micro_batch=1, num_micro_batches=16, schedule="1f1b", zero=0,
                iteration_time_s=0.5, throughput_samples_per_s=64.0, stages=(stage0, stage1),
                breakdown=dict(BREAKDOWN), search=SearchInfo(time_s=1.0, candidates_evaluated=99, lower_bound_s=0.45))


def dlrm_plan() -> Plan:
    stage = StagePlan(index=0, first_layer=0, last_layer=2, layer_names=("bottom_mlp", "interaction", "top_mlp"),
                      layer_kinds=("mlp", "other", "mlp"),
                      device_type="a100-80gb", devices=tuple(range(16)), tp=1, dp=16, recompute="none",
                      memory_bytes_per_device=20e9, time_s=0.003)
    embeddings = (
        EmbeddingPlacement("t_small", "data_parallel",
                           tuple(EmbeddingShard(d, (0, 1000), (0, 64)) for d in range(16)), compute_kernel="dense"),
        EmbeddingPlacement("t_tw", "table_wise", (EmbeddingShard(9, (0, 10**6), (0, 128)),)),
        # row-wise over all 16 devices in TorchRec's blocks of ceil(1_000_003 / 16) = 62_501 rows
        EmbeddingPlacement("t_rw", "row_wise", tuple(EmbeddingShard(d, (d * 62_501, min((d + 1) * 62_501, 1_000_003)),
                                                                    (0, 128)) for d in range(16))),
        EmbeddingPlacement("t_cw", "column_wise", (EmbeddingShard(10, (0, 5000), (0, 64)),
                                                   EmbeddingShard(11, (0, 5000), (64, 128)))),
        EmbeddingPlacement("t_host", "table_wise", (EmbeddingShard(12, (0, 10**8), (0, 128), memory="host"),)),
    )
    return Plan(model={"name": "dlrm-test", "params": 10**9, "flops_per_sample": 1e8}, cluster=CLUSTER_2x8,
                global_batch=65536, micro_batch=4096, num_micro_batches=1, schedule="1f1b", zero=0,
                iteration_time_s=0.02, throughput_samples_per_s=65536 / 0.02, stages=(stage,),
                breakdown={**BREAKDOWN, "embedding_s": 0.004}, embeddings=embeddings,
                search=SearchInfo(time_s=2.0, candidates_evaluated=5, proven_optimal=False, lower_bound_s=0.018,
                                  embedding_lower_bound_s=0.0035, algorithm="embedding MILP"))


ALL = {"gpt": gpt_plan, "gpt_uneven": lambda: gpt_plan((4, 3, 3)), "gpt_vpp": lambda: gpt_plan((5, 5), vpp=2),
       "mixed": mixed_plan, "dlrm": dlrm_plan}
