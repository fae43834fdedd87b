"""Print a compact summary of `libreyolo bench step json=true` outputs: python benchmarks/summarize.py FILE..."""

import json
import sys

verbose = "-v" in sys.argv


def records(path):
    with open(path) as f:
        text = f.read().strip()
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


for path in [a for a in sys.argv[1:] if a != "-v"]:
    for d in records(path):
        m = d["meta"]
        print(
            f"== {path}: {m['model']} b{m['batch']} {m['imgsz']}px {m['amp_dtype'] if m['amp'] else 'fp32'} {m['gpu']} "
            f"torch {m['torch']} cap {m['targets_capacity']}"
        )
        for r in d["results"]:
            print(
                f"  {r['mode']:<6} median {r['median_ms']:7.1f} ms  min {r['min_ms']:7.1f}  "
                f"x{r['speedup_vs_eager'] or 0:4.2f}  "
                f"kernels {r.get('kernels_per_step', 0):6.0f}  launches {r.get('launches_per_step', 0):6.0f}  busy "
                f"{r.get('gpu_busy_ms_per_step') or 0:6.1f} ms "
                f"(kernel sum {r.get('kernel_time_sum_ms_per_step') or 0:.1f}, {r.get('gpu_busy_frac') or 0:.0%} of "
                "the profiled window)  "
                f"peak {r['peak_allocated_gb'] or 0:.2f}/{r['peak_reserved_gb'] or 0:.2f} GiB"
            )
            if r.get("per_phase"):
                print("     phases: " + ", ".join(f"{k} {v:.0f}" for k, v in r["per_phase"].items()))
            if r.get("top_kernels") and verbose:
                for k, v in list(r["top_kernels"].items())[:25]:
                    print(f"     {v:7.1f}  {k}")
            for n in r.get("notes", []):
                print(f"     note: {n}")
