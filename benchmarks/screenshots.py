"""Screenshots for the docs, taken in headless Chromium: TensorBoard's scalars on a real run's event files
(``docs/assets/tensorboard.png``, shown in the TensorBoard guide), and, with ``--pages``, pages of the built site
(for a look before a release; not kept in the repository).

    python benchmarks/screenshots.py --logdir runs                     # TensorBoard on your run's folder
    python benchmarks/screenshots.py                                   # trains a short demo run first (~2 min)
    mkdocs build && python benchmarks/screenshots.py --logdir runs --pages index benchmarks guides/troubleshooting

Needs Chromium (Debian: ``apt-get install chromium``; ``--chromium`` names another binary) and ``tensorboard``.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the tags the screenshot shows (a regex of TensorBoard's tag filter): the figures a healthy run is read by
TAGS = "|".join(
    ("rollout/success_rate", "rollout/reward_mean", "rollout/frac_uniform_groups", "rollout/completion_length",
     "train/entropy", "train/grad_norm")
)  # fmt: skip


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(url: str, seconds: float = 60.0) -> None:
    """Until ``url`` answers 200 (``TimeoutError`` after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(url, timeout=2) as answer:
                if answer.status == 200:
                    return
        time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer in {seconds:.0f} s")


def screenshot(chromium: str, url: str, out: Path, width: int, height: int, wait_ms: int) -> None:
    """One page, rendered headless at ``width`` x ``height`` after ``wait_ms`` of (virtual) time, to ``out``."""
    with tempfile.TemporaryDirectory(prefix="chromium_") as profile:
        command = [
            chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            "--hide-scrollbars", f"--user-data-dir={profile}", f"--window-size={width},{height}",
            f"--virtual-time-budget={wait_ms}", f"--screenshot={out}", url,
        ]  # fmt: skip
        subprocess.run(command, check=True, capture_output=True, timeout=120)
    print(f"wrote {out}")


def demo_run(logdir: Path) -> None:
    """A short demo run (500 cold-start steps, 150 GRPO iterations) logged to ``logdir``."""
    command = [sys.executable, "-m", "algorithms.cli", "train", "--preset", "demo", "-n", str(150 * 128),
               "--tensorboard-log", str(logdir), "--save-path", str(logdir / "demo.zip"), "--no-progress-bar",
               "--checkpoint-every", "0", "-params", "eval_problems:50"]  # fmt: skip
    subprocess.run(command, check=True, cwd=ROOT)


@contextlib.contextmanager
def tensorboard(logdir: Path) -> Iterator[str]:
    """TensorBoard on ``logdir`` at a free loopback port: its address."""
    port = free_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1",
               "--port", str(port), "--reload_interval", "0"]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(f"http://127.0.0.1:{port}/data/logdir")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # the requests are not worth a line each
        pass


@contextlib.contextmanager
def site(folder: Path) -> Iterator[str]:
    """The built docs site (``mkdocs build``'s ``site/``) served on a free loopback port: its address."""
    handler = partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--logdir", type=Path, help="a run's TensorBoard folder (default: train a short demo run)")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "assets" / "tensorboard.png")
    parser.add_argument("--pages", nargs="*", default=[], help="pages of site/ to take too (index, guides/tools, ...)")
    parser.add_argument("--pages-out", type=Path, default=Path(tempfile.gettempdir()) / "grpo_gym_pages")
    parser.add_argument("--chromium", default=shutil.which("chromium") or shutil.which("chromium-browser"))
    args = parser.parse_args()
    if args.chromium is None:
        raise SystemExit("no Chromium found: apt-get install chromium, or pass --chromium <binary>")
    with tempfile.TemporaryDirectory(prefix="tb_run_") as tmp:
        logdir = args.logdir
        if logdir is None:
            logdir = Path(tmp)
            demo_run(logdir)
        with tensorboard(logdir) as url:
            view = f"{url}/#scalars&tagFilter={urllib.request.quote(TAGS, safe='')}&_smoothingWeight=0.9"
            screenshot(args.chromium, view, args.out, 1400, 1000, 30000)
    if args.pages:
        args.pages_out.mkdir(parents=True, exist_ok=True)
        with site(ROOT / "site") as url:
            for page in args.pages:
                path = "" if page == "index" else f"{page}/"
                out = args.pages_out / f"{page.replace('/', '_')}.png"
                screenshot(args.chromium, f"{url}/{path}", out, 1280, 2400, 5000)


if __name__ == "__main__":
    main()
