"""Encoder-decoder Transformer training benchmark on every GPU of a node (seed document 004).

Run under torchrun (one process per GPU, DistributedDataParallel over NCCL):

    torchrun --standalone --nproc_per_node=8 benchmark.py --batch-size 128 --epochs 5

Synthetic data: random integer tokens generated in CPU memory (no disk I/O),
sharded across ranks. `--warmup-epochs` run first and are not measured. Per
measured epoch: wall time and samples/s aggregated over all GPUs; overall:
peak GPU memory (the largest of the ranks), fp16 autocast unless `--no-amp`.

Rank 0 reports to orch (`ORCH_PHASE`, `ORCH_METRIC`); orch samples GPU
utilisation and energy itself. `--results-dir` also writes the document's JSON
(`bench_{GPU}_{N}gpu_{TIMESTAMP}.json`: hardware, software, configuration,
per-epoch metrics, summary).
"""

import argparse
import datetime
import json
import os
import platform
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Seq2Seq(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.emb = nn.Embedding(a.vocab_size, a.d_model)
        self.pos = nn.Embedding(a.seq_len, a.d_model)
        self.core = nn.Transformer(
            d_model=a.d_model,
            nhead=a.nhead,
            num_encoder_layers=a.num_encoder_layers,
            num_decoder_layers=a.num_decoder_layers,
            dim_feedforward=a.dim_feedforward,
            batch_first=True,
        )
        self.head = nn.Linear(a.d_model, a.vocab_size)

    def forward(self, src, tgt):
        p = torch.arange(src.shape[1], device=src.device)
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=src.device)
        h = self.core(self.emb(src) + self.pos(p), self.emb(tgt) + self.pos(p[: tgt.shape[1]]), tgt_mask=mask, tgt_is_causal=True)
        return self.head(h)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=64, help="per GPU")
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs")
    ap.add_argument("--warmup-epochs", type=int, default=1)
    ap.add_argument("--num-samples", type=int, default=65536, help="samples per epoch, all GPUs together")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--nhead", type=int, default=4)
    ap.add_argument("--num-encoder-layers", type=int, default=3)
    ap.add_argument("--num-decoder-layers", type=int, default=3)
    ap.add_argument("--dim-feedforward", type=int, default=512)
    ap.add_argument("--no-amp", action="store_true")
    ap.add_argument("--results-dir", default=None)
    a = ap.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("nccl")
        rank, world, local = dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"])
    else:
        rank, world, local = 0, 1, 0
    torch.cuda.set_device(local)
    dev = torch.device("cuda", local)
    lead = rank == 0

    torch.manual_seed(0)
    model = Seq2Seq(a).to(dev)
    params = sum(p.numel() for p in model.parameters())
    if distributed:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler("cuda", enabled=not a.no_amp)

    # This rank's shard of the synthetic dataset, in CPU memory.
    per_rank = a.num_samples // world
    g = torch.Generator().manual_seed(1000 + rank)
    data = torch.randint(0, a.vocab_size, (per_rank, a.seq_len + 1), generator=g)
    batches = per_rank // a.batch_size
    if lead:
        print(
            f"{params / 1e6:.2f}M parameters, {world} GPU(s) x batch {a.batch_size}, "
            f"{batches} steps per epoch, {'fp32' if a.no_amp else 'fp16 amp'}",
            flush=True,
        )

    def epoch():
        model.train()
        for i in range(batches):
            b = data[i * a.batch_size : (i + 1) * a.batch_size].to(dev, non_blocking=True)
            src, tgt_in, tgt_out = b[:, :-1], b[:, :-1], b[:, 1:]
            with torch.autocast("cuda", dtype=torch.float16, enabled=not a.no_amp):
                logits = model(src, tgt_in)
                loss = F.cross_entropy(logits.float().reshape(-1, a.vocab_size), tgt_out.reshape(-1))
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        torch.cuda.synchronize()
        return float(loss)

    if lead:
        print("ORCH_PHASE warmup", flush=True)
    for _ in range(a.warmup_epochs):
        epoch()
    torch.cuda.reset_peak_memory_stats(dev)
    if distributed:
        dist.barrier()

    if lead:
        print("ORCH_PHASE measure", flush=True)
    epochs = []
    for e in range(a.epochs):
        if distributed:
            dist.barrier()
        t0 = time.perf_counter()
        loss = epoch()
        if distributed:
            dist.barrier()
        dt = time.perf_counter() - t0
        samples = batches * a.batch_size * world
        epochs.append({"epoch": e + 1, "wall_s": dt, "samples_per_s": samples / dt, "loss": loss})
        if lead:
            print(f"epoch {e + 1}: {dt:.2f}s, {samples / dt:.0f} samples/s, loss {loss:.3f}", flush=True)
    peak = torch.tensor([torch.cuda.max_memory_allocated(dev)], device=dev)
    if distributed:
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    if lead:
        print("ORCH_PHASE teardown", flush=True)
        walls = [x["wall_s"] for x in epochs]
        summary = {
            "samples_per_s": statistics.fmean(x["samples_per_s"] for x in epochs),
            "samples_per_s_per_gpu": statistics.fmean(x["samples_per_s"] for x in epochs) / world,
            "epoch_time_mean_s": statistics.fmean(walls),
            "epoch_time_std_s": statistics.stdev(walls) if len(walls) > 1 else 0.0,
            "epoch_time_min_s": min(walls),
            "epoch_time_max_s": max(walls),
            "torch_peak_memory_bytes": int(peak.item()),
            "world_size": world,
            "params": params,
            "steps": a.epochs * batches,
            "final_loss": epochs[-1]["loss"],
        }
        print("ORCH_METRIC " + " ".join(f"{k}={v}" for k, v in summary.items()), flush=True)
        if a.results_dir:
            name = torch.cuda.get_device_name(dev).replace(" ", "_")
            stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
            os.makedirs(a.results_dir, exist_ok=True)
            path = os.path.join(a.results_dir, f"bench_{name}_{world}gpu_{stamp}.json")
            with open(path, "w") as f:
                json.dump(
                    {
                        "hardware": {
                            "gpu": torch.cuda.get_device_name(dev),
                            "gpu_count": world,
                            "gpu_memory_bytes": torch.cuda.get_device_properties(dev).total_memory,
                            "host": socket.gethostname(),
                            "cpu": platform.processor(),
                        },
                        "software": {
                            "python": platform.python_version(),
                            "torch": torch.__version__,
                            "cuda": torch.version.cuda,
                            "nccl": ".".join(map(str, torch.cuda.nccl.version())),
                        },
                        "config": vars(a),
                        "epochs": epochs,
                        "summary": summary,
                    },
                    f,
                    indent=2,
                )
            print(f"wrote {path}", flush=True)
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
