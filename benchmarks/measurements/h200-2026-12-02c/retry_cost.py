"""What a caching-allocator retry costs (issue 28): when cudaMalloc fails, PyTorch frees every
cached unused block (cudaFree each segment, after a device synchronize) and retries. Fills the card
with N cached 1 GiB-class segments (allocated, then freed to the cache), then asks for one block
no cached segment can serve, with nothing left on the card: the request retries. Times that request
against the same request when the cache was already empty. Prints `RETRY {json}` per N."""
import json
import time

import torch

GiB = 1 << 30


def timed_alloc(nbytes: int) -> float:
    torch.cuda.synchronize()
    t = time.perf_counter()
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    del x
    return dt


def main() -> None:
    torch.cuda.set_device(0)
    free, total = torch.cuda.mem_get_info()
    for seg_mib in (1024, 256, 64, 21):
        for fill in (0.5, 0.95):
            torch.cuda.empty_cache()
            free, total = torch.cuda.mem_get_info()
            seg = seg_mib << 20
            n = int(free * fill) // seg
            blocks = [torch.empty(seg, dtype=torch.uint8, device="cuda") for _ in range(n)]
            del blocks  # all cached, none in use
            free_now, _ = torch.cuda.mem_get_info()
            ask = free_now + seg * n // 2  # more than the card has free: only freeing the cache makes room
            before = torch.cuda.memory_stats().get("num_alloc_retries", 0)
            t_retry = timed_alloc(ask)
            retries = torch.cuda.memory_stats().get("num_alloc_retries", 0) - before
            t_plain = timed_alloc(ask)  # same request, cache now empty: a plain cudaMalloc
            torch.cuda.empty_cache()
            print("RETRY " + json.dumps({"segment_mib": seg_mib, "segments": n, "ask_gib": ask / GiB,
                                         "retries": retries, "retry_s": t_retry, "plain_s": t_plain,
                                         "cost_s": t_retry - t_plain}), flush=True)


if __name__ == "__main__":
    main()
