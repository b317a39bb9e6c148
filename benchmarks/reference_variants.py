"""flash_attention's and conv2d's references, each TMA config of the attention kernel alone, and
the parts of conv2d's call, against SDPA / cuDNN, side by side (GPU only).

    python benchmarks/reference_variants.py [OLD_DIR]

`triton.testing.do_bench` medians of 3 interleaved rounds (L2 flushed before each call); these
are wall-clock times of the whole call, the host's launches included, unlike the grading
method's GPU time (benchmarks/references.py). OLD_DIR, if given, holds earlier copies of the two
references (flash_old.py, conv2d_old.py) timed beside them. Writes sweep.json to $OUT (or /tmp).
Environment: SWEEP_BUDGET (seconds, default 420) stops starting new cases after that long.
"""
import importlib.util, json, os, sys, time, traceback, statistics
import torch, triton, triton.language as tl
import torch.nn.functional as F
from triton.testing import do_bench

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "reference")
OLD = sys.argv[1] if len(sys.argv) > 1 else None
OUT = os.environ.get("OUT", "/tmp")
T0 = time.time()
BUDGET = float(os.environ.get("SWEEP_BUDGET", "420"))

def load(name, folder, file):
    if folder is None or not os.path.isfile(os.path.join(folder, file)):
        return None
    s = importlib.util.spec_from_file_location(name, os.path.join(folder, file)); m = importlib.util.module_from_spec(s); s.loader.exec_module(m); return m

fnew, fold = load("fnew", HERE, "flash_attention.py"), load("fold", OLD, "flash_old.py")
cnew, cold = load("cnew", HERE, "conv2d.py"), load("cold", OLD, "conv2d_old.py")
props = torch.cuda.get_device_properties(0)
print(f"GPU {props.name} SMs {props.multi_processor_count}; torch {torch.__version__} triton {triton.__version__}", flush=True)
import inspect
print("tl.range params:", list(inspect.signature(tl.range.__init__).parameters), flush=True)
rows = []

def timeit(fns, rounds=3):
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            if f is None: continue
            try:
                res[k].append(do_bench(f, warmup=5, rep=40, return_mode="median"))
            except Exception as e:
                print(f"  {k} failed: {type(e).__name__}: {str(e)[:300]}", flush=True); fns[k] = None
    return {k: statistics.median(v) for k, v in res.items() if v}

def rel(a, b):
    return ((a.double() - b.double()).abs().max() / b.double().abs().max()).item()

# ---------------- flash attention ----------------
def flash_sweep():
    B, H, N = 4, 32, 4096
    for D in (64, 128):
        for causal in (True, False):
            for dt in (torch.float16, torch.bfloat16):
                if time.time() - T0 > BUDGET: print("budget: stop flash", flush=True); return
                g = torch.Generator(device="cuda").manual_seed(0)
                q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=dt, generator=g) for _ in range(3))
                flops = 4 * B * H * N * N * D // (2 if causal else 1)
                want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
                if fold and D == 64 and dt == torch.float16:
                    fns["old"] = lambda: fold.flash_attention(q, k, v, causal)
                errs = {}
                for i, shape in enumerate(fnew.TMA_SHAPES):
                    kern = triton.autotune(configs=fnew._tma_configs([shape]), key=["n_ctx", "HEAD_DIM", "CAUSAL"])(fnew._attn_fwd_tma.fn)
                    name = "tma" + "-".join(map(str, shape))
                    def run(kern=kern):
                        o = torch.empty_like(q); sc = 1.0 / D ** 0.5
                        fnew._flash_attention_tma(q, k, v, o, causal, sc, kernel=kern); return o
                    try:
                        errs[name] = rel(run(), want); torch.cuda.synchronize()
                        fns[name] = run
                    except Exception as e:
                        print(f"  {name} D={D} causal={causal} {dt}: {type(e).__name__}: {str(e)[:200]}", flush=True)
                try:
                    errs["ref_autotuned"] = rel(fnew.flash_attention(q, k, v, causal), want)
                    fns["ref_autotuned"] = lambda: fnew.flash_attention(q, k, v, causal)
                except Exception as e:
                    print(f"  ref_autotuned: {type(e).__name__}: {str(e)[:200]}", flush=True)
                if "old" in fns: errs["old"] = rel(fold.flash_attention(q, k, v, causal), want)
                ms = timeit(fns)
                best = getattr(fnew._attn_fwd_tma, "best_config", None)
                sd = ms["sdpa"]
                for name, m in sorted(ms.items(), key=lambda x: x[1]):
                    row = dict(kind="flash", D=D, causal=causal, dtype=str(dt)[6:], variant=name, ms=round(m, 4),
                               tflops=round(flops / m / 1e9, 1), speed_vs_vendor=round(sd / m, 3), rel_err_vs_sdpa=errs.get(name))
                    rows.append(row); print("  ", row, flush=True)
                print(f"  autotuned best: {best}", flush=True)


# ---------------- conv2d ----------------
CONV = [  # N, C, H, W, K, R
    (32, 64, 56, 56, 64, 3),
    (32, 128, 28, 28, 128, 3),
    (32, 256, 14, 14, 256, 3),
    (32, 256, 56, 56, 64, 1),
]
def conv_sweep():
    for (NB, C, H, W, K, R) in CONV:
        for dt in (torch.float16, torch.bfloat16):
            if dt == torch.bfloat16 and (C, H) != (64, 56): continue
            if time.time() - T0 > BUDGET + 60: print("budget: stop conv", flush=True); return
            g = torch.Generator(device="cuda").manual_seed(0)
            x = torch.randn(NB, C, H, W, device="cuda", dtype=dt, generator=g)
            w = torch.randn(K, C, R, R, device="cuda", dtype=dt, generator=g)
            P = H - R + 1
            flops = 2 * NB * K * P * P * C * R * R
            want = F.conv2d(x, w)
            rows_ = torch.empty((NB * H * W, C), dtype=x.dtype, device=x.device)
            xcl = x.contiguous(memory_format=torch.channels_last)
            fns = {"cudnn": lambda: F.conv2d(x, w), "old": (lambda: cold.conv2d(x, w)) if cold else None,
                   "new": lambda: cnew.conv2d(x, w), "new, channels-last input": lambda: cnew.conv2d(xcl, w),
                   "(part) torch permute copy": lambda: x.permute(0, 2, 3, 1).contiguous(),
                   "(part) triton transpose": lambda: cnew._nchw_to_nhwc[(triton.cdiv(H * W, 64), triton.cdiv(C, 64), NB)](x, rows_, C, H * W, BLOCK_C=64, BLOCK_HW=64),
                   "(part) w permute": lambda: w.permute(2, 3, 1, 0).contiguous()}
            errs = {}
            for name in [n for n in ("old", "new", "new, channels-last input") if fns[n]]:
                try:
                    errs[name] = rel(fns[name](), want)
                except Exception as e:
                    print(f"  conv {name}: {type(e).__name__}: {str(e)[:300]}", flush=True); fns[name] = None
            ms = timeit(fns)
            sd = ms["cudnn"]
            for name, m in sorted(ms.items(), key=lambda x: x[1]):
                row = dict(kind="conv", case=f"{NB}x{C}x{H}x{W}-K={K}-{R}x{R}", dtype=str(dt)[6:], variant=name, ms=round(m, 4),
                           tflops=round(flops / m / 1e9, 1), speed_vs_vendor=round(sd / m, 3), rel_err_vs_cudnn=errs.get(name))
                rows.append(row); print("  ", row, flush=True)
            print(f"  conv best config: {getattr(cnew._conv2d_tma, 'best_config', None)}", flush=True)

try:
    conv_sweep()
except Exception:
    traceback.print_exc()
try:
    flash_sweep()
except Exception:
    traceback.print_exc()
json.dump(rows, open(os.path.join(OUT, "sweep.json"), "w"), indent=1)
print("\n| kind | case | dtype | variant | ms | TFLOP/s | speed / vendor | rel err |")
for r in rows:
    case = r.get("case") or f"D={r['D']} causal={r['causal']}"
    print(f"| {r['kind']} | {case} | {r['dtype']} | {r['variant']} | {r['ms']} | {r['tflops']} | {r['speed_vs_vendor']} | {r.get('rel_err_vs_sdpa', r.get('rel_err_vs_cudnn'))} |")
print(f"total {time.time() - T0:.0f}s")
