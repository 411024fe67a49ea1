"""The bare platform beside orch in scripts/bench-modal.sh: sandboxes made and
waited for with Modal's official Python client (`modal`), as a user who needs
no orch would, against the same fake Modal server in the same run.

    python3 modal_sandboxes.py N     (MODAL_SERVER_URL, MODAL_TOKEN_ID, MODAL_TOKEN_SECRET set)

N sandboxes running `true` in the cells' image (`debian:bookworm-slim`, a
static busybox on the fake), all started at once (as orch starts the suite's
N cells), each timed from just before `Sandbox.create` to its `wait()`
returning (the platform's own start: the create, the container's start and
run, its end seen). The image is made once before (one sandbox, not timed),
as orch's run finds it made by its warm-up. Prints one JSON object: the
milliseconds of each sandbox, sorted. `MODAL_SANDBOX_V2=0`: the client's
`SandboxCreate` (V1), the call orch makes and the fake serves (1.6's default
for a sandbox without a GPU is `SandboxCreateV2`).
"""

import asyncio
import json
import os
import sys
import time

os.environ["MODAL_SANDBOX_V2"] = "0"
import modal  # noqa: E402


async def main(n):
    app = await modal.App.lookup.aio("orch-bare", create_if_missing=True)
    image = modal.Image.from_registry("debian:bookworm-slim")
    warm = await modal.Sandbox.create.aio("true", app=app, image=image, timeout=60)
    await warm.wait.aio(raise_on_termination=False)

    async def one():
        t0 = time.perf_counter()
        sb = await modal.Sandbox.create.aio("true", app=app, image=image, timeout=60)
        await sb.wait.aio(raise_on_termination=False)
        took = (time.perf_counter() - t0) * 1000
        if sb.returncode != 0:
            raise SystemExit(f"bare sandbox {sb.object_id} ended {sb.returncode}")
        return took

    took = await asyncio.gather(*(one() for _ in range(n)))
    print(json.dumps({"shape": "true", "ms": sorted(round(t, 1) for t in took)}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
