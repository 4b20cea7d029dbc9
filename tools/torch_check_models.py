#!/usr/bin/env python3
"""torch_check_models.py: the live models of tools/torch-check.py's side by
side run, for a worker process whose allocator is set up (tools/ on
sys.path):

    import torch_check_models
    rate, unit, checksum, note = torch_check_models.WORKLOADS[name](torch,
                                                                   quick)

Each runs a variable-batch schedule drawn from a fixed seed, so that every
allocator sees the same shapes: GPT-2 prefill and generation
(transformers, built from its config: no download) and ResNet-50 training
(torchvision), or a small transformer written here when transformers is
missing. The rate leaves out the first steps (warm-up); the checksum of
the outputs must agree across allocators.
"""
import time


def schedule(seed, n, pick):
    import random
    rng = random.Random(seed)
    return [pick(rng) for _ in range(n)]


def gpt2(torch, quick):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config()).cuda().half().eval()
    return model


def tiny_lm(torch):
    """A small decoder-only transformer, when transformers is missing."""
    nn = torch.nn

    class TinyLM(nn.Module):
        def __init__(self, vocab=8192, d=512, layers=6):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            layer = nn.TransformerEncoderLayer(d, 8, 4 * d, batch_first=True,
                                               dropout=0.0)
            self.body = nn.TransformerEncoder(layer, layers)
            self.head = nn.Linear(d, vocab)

        def forward(self, ids):
            n = ids.shape[1]
            mask = torch.triu(torch.full((n, n), float("-inf"),
                                         device=ids.device), 1)
            return self.head(self.body(self.emb(ids), mask=mask))

    torch.manual_seed(0)
    return TinyLM().cuda().half().eval()


def bench_prefill(torch, quick):
    try:
        model, vocab, note = gpt2(torch, quick), 50257, ""
    except ImportError:
        model, vocab = tiny_lm(torch), 8192
        note = "transformers missing: a small transformer instead of GPT-2"
    shapes = schedule(1, 12 if quick else 60,
                      lambda r: (r.randint(1, 32), r.randint(16, 512)))
    tokens, checksum = 0, 0.0
    with torch.no_grad():
        for i, (b, s) in enumerate(shapes):
            if i == 2:
                torch.cuda.synchronize()
                start = time.perf_counter()
                tokens = 0
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, vocab, (b, s), generator=g).cuda()
            out = model(ids)
            logits = out.logits if hasattr(out, "logits") else out
            checksum += float(logits[:, -1].float().sum())
            tokens += b * s
    torch.cuda.synchronize()
    return tokens / (time.perf_counter() - start), "tok/s", checksum, note


def bench_generate(torch, quick):
    try:
        model = gpt2(torch, quick)
    except ImportError:
        return None, "tok/s", None, "transformers missing: skipped"
    plan = schedule(2, 3 if quick else 10,
                    lambda r: (r.randint(1, 16), r.randint(16, 128)))
    new_tokens, checksum = 0, 0
    torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.no_grad():
        for i, (b, n) in enumerate(plan):
            g = torch.Generator().manual_seed(100 + i)
            ids = torch.randint(0, 50257, (b, 32), generator=g).cuda()
            out = model.generate(ids, max_new_tokens=n, min_new_tokens=n,
                                 do_sample=False, pad_token_id=0)
            checksum += int(out.sum())
            new_tokens += b * n
    torch.cuda.synchronize()
    return new_tokens / (time.perf_counter() - start), "tok/s", checksum, ""


def bench_resnet(torch, quick):
    try:
        import torchvision
        torch.manual_seed(0)
        model, note = torchvision.models.resnet50().cuda(), ""
        size = 224
    except ImportError:
        return None, "img/s", None, "torchvision missing: skipped"
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = schedule(3, 8 if quick else 40, lambda r: r.randint(8, 96))
    images, checksum = 0, 0.0
    for i, b in enumerate(batches):
        if i == 2:
            torch.cuda.synchronize()
            start = time.perf_counter()
            images = 0
        g = torch.Generator().manual_seed(200 + i)
        x = torch.randn(b, 3, size, size, generator=g).cuda()
        y = torch.randint(0, 1000, (b,), generator=g).cuda()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        checksum += float(loss)
        images += b
    torch.cuda.synchronize()
    return images / (time.perf_counter() - start), "img/s", checksum, note


WORKLOADS = {"gpt2-prefill": bench_prefill, "gpt2-generate": bench_generate,
             "resnet50-train": bench_resnet}
