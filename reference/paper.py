"""Numbers quoted from the paper (arXiv 2610.19605) that this project's code uses, each with its figure
or table. Nothing here is measured or computed by this project; code that shows a paper number
(a claim, a "paper" column, a star in a figure) formats it from here.

Method names are those of `reference.methods.METHODS`. The paper's "GB" in Fig. 6 are GiB:
FP16's 38.48 at B = 20 only fits a 40 GiB card as GiB.
"""

from __future__ import annotations

# -- efficiency setting of Fig. 6 and Fig. 7 (Section 6) -------------------------------------

GPU = "A100-SXM4-40GB"
GPU_MEMORY_GIB = 40.0
MODEL = "Qwen3-8B"
PROMPT = 141  # prompt tokens P of every efficiency run
#: How the report names where these numbers come from.
EFFICIENCY_SETTING = f"{GPU}, {MODEL}, P = {PROMPT}"

# -- Fig. 6a: peak memory vs generation length at B = 32 --------------------------------------

FIG6A_BATCH = 32
#: The longest generation each method fits in 40 GB (FP16 exceeds it beyond 4K; PN-Mix fits 32K, 8x).
FIG6A_MAX_GENERATION = {"FP16": 4096, "PN-Mix": 32768}

# -- Fig. 6b: peak memory vs batch at L_gen = 8K ----------------------------------------------

FIG6B_GENERATION = 8192
#: The largest batch each method ran and its peak memory there, GiB (FP16 runs out of memory at B = 21).
FIG6B_MAX_BATCH = {"FP16": (20, 38.48), "PN-Mix": (110, 38.21)}
FIG6B_BATCH_RATIO = 5.5  # PN-Mix's largest batch over FP16's

# -- Fig. 6c: decode throughput at L_gen = 8K -------------------------------------------------

#: Tokens/s by (method, batch): FP16 is faster at B = 20, PN-Mix passes FP16's best at B = 23.
FIG6C_TOKENS_PER_S = {("FP16", 20): 469.8, ("PN-Mix", 20): 420.8, ("PN-Mix", 23): 485.0, ("PN-Mix", 110): 1114.0}
FIG6C_MAX_RATIO = 2.37  # PN-Mix's largest feasible throughput over FP16's

# -- Fig. 7: per-step decode latency, B = 1, L_gen = 32K (torch.cuda.Event) -------------------

FIG7_GENERATION = 32 * 1024
#: Decode steps of the slope fit, "11K-31K" (K = 1024, so that 32K is the 32768-token generation).
FIG7_FIT = (11 * 1024, 31 * 1024)
FIG7_SLOPE_US = {"PN-Mix": 2.17, "Kitty": 2.38}  # latency added per step over FIG7_FIT
FIG7_SLOPE_REDUCTION = 0.088  # PN-Mix's slope is 8.8% lower than Kitty's
FIG7_GAP_AT_END_MS = 6.8  # PN-Mix is this much faster than Kitty per step at 32K

# -- fidelity (Fig. 5, Table 11) and accuracy (Table 2) ---------------------------------------

FIG5_TOP_PERCENT = (10, 30, 50)
#: Median share (%) of decode-time importance held by the top 10/30/50% pairs.
FIG5_SHARE_PERCENT = {"Qwen3-14B": (89.3, 97.0, 98.7), "Qwen3-32B": (86.0, 94.8, 97.4)}
#: Overlap of the prefill selection with decode-time salient pairs at r = 50%, by reference
#: ("pair-norm", "dot": |<q_i, k_i>|), over four decode ranges of a 32,672-token generation...
TABLE11_OVERLAP = {"pair-norm": 0.72, "dot": 0.68}
#: Mean accuracy (FP16, PN-Mix) by model.
TABLE2_MEAN_ACCURACY = {"Qwen3-8B": (77.85, 77.21), "Llama-3.1-8B": (54.04, 53.08)}

# -- storage accounting (Appendix) ------------------------------------------------------------

N_QUANTIZED = 32768  # T_q of the length-dependent terms of every bit width the paper quotes
PN_MIX_KEY_BITS = 2.26  # the main configuration, "about 2.26" bits per key element
PN_MIX_KEY_BITS_RANGE = (2.26, 2.28)  # across PN-Mix's variants
COMPARISON_BITS = (2.25, 2.4)  # the bit range of the paper's comparisons
