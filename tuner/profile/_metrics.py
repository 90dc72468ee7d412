"""The fixed Nsight Compute metric set ``tiledtune profile`` collects (sm_90 names; checked
against ``ncu --query-metrics --chip gh100``, Nsight Compute 2025.3). ncu's raw page adds the
launch statistics by itself (``launch__grid_size``, ``launch__registers_per_thread``,
``launch__occupancy_limit_*``, ``sm__maximum_warps_per_active_cycle_pct``, ...)."""

from __future__ import annotations

#: warp stall reasons, each read as ``smsp__average_warps_issue_stalled_<reason>_per_issue_
#: active.ratio``: warps stalled for that reason per issued instruction
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "gmma", "imc_miss",
                 "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar",
                 "mio_throttle", "misc", "no_instruction", "not_selected", "selected",
                 "short_scoreboard", "sleeping", "tex_throttle", "wait")


def stall_metric(reason: str) -> str:
    return f"smsp__average_warps_issue_stalled_{reason}_per_issue_active.ratio"


#: what each column of the summary reads (name -> ncu metric)
TIME = "gpu__time_duration.sum"
SM_THROUGHPUT = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
TENSOR_PIPE = "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
LSU_PIPE = "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active"
L1_THROUGHPUT = "l1tex__throughput.avg.pct_of_peak_sustained_active"
DRAM_THROUGHPUT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
DRAM_READ = "dram__bytes_read.sum"
DRAM_WRITE = "dram__bytes_write.sum"
L2_THROUGHPUT = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
L2_BYTES = "lts__t_bytes.sum"
ACHIEVED_OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
LOCAL_LOAD = "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum"
LOCAL_STORE = "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum"

METRICS = (TIME, SM_THROUGHPUT, TENSOR_PIPE, LSU_PIPE, L1_THROUGHPUT, DRAM_THROUGHPUT,
           DRAM_READ, DRAM_WRITE, L2_THROUGHPUT, L2_BYTES, ACHIEVED_OCCUPANCY, LOCAL_LOAD,
           LOCAL_STORE) + tuple(stall_metric(r) for r in STALL_REASONS)

#: launch statistics the raw page carries without being asked
THEORETICAL_OCCUPANCY = "sm__maximum_warps_per_active_cycle_pct"
REGISTERS = "launch__registers_per_thread"
GRID = "launch__grid_size"
BLOCK = "launch__block_size"
CLUSTER = "launch__cluster_size"
WAVES = "launch__waves_per_multiprocessor"
SHARED = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")
#: what can cap the blocks a multiprocessor holds (limit metric -> the word for it)
OCCUPANCY_LIMITS = {"launch__occupancy_limit_registers": "registers",
                    "launch__occupancy_limit_shared_mem": "shared memory",
                    "launch__occupancy_limit_warps": "warps",
                    "launch__occupancy_limit_blocks": "blocks"}
