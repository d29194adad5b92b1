"""Serve a trained model over HTTP: ``grpo-gym serve`` (OpenAI's ``POST /v1/completions``, ``GET /health``), then
a client's request. Needs ``pip install "grpo-gym[serve]"``.

A model trained by the other examples (a ``.zip`` or a ``save_pretrained`` folder), or the built-in tiny model after
a short cold start when none is given::

    python examples/serve.py                      # trains a small one first
    python examples/serve.py --model your_data.zip
"""

import argparse
import signal
import subprocess
import sys
import time

import gymnasium as gym
import httpx

import grpo_gym  # noqa: F401
from algorithms import GRPO
from algorithms.cli_types import PORT, STEPS

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--model", help="a GRPO .zip or a save_pretrained folder (default: trains a small one)")
parser.add_argument("--cold-start-steps", type=STEPS, default=300)
parser.add_argument("--port", type=PORT, default=8765)
args = parser.parse_args()

if args.model is None:
    env = gym.make("R1Zero-v0", template="compact", max_new_tokens=32)
    model = GRPO("TransformerPolicy", env, cold_start_kwargs={"steps": args.cold_start_steps}, seed=0)
    model.run_cold_start()
    model.save_pretrained("served-model")  # model and tokenizer, a Hugging Face folder
    args.model = "served-model"
    obs, info = env.reset(seed=0)
    prompt = info["prompt"]  # a problem in the template the model was trained on
else:
    prompt = "What is 12+7?"  # send your model the template it was trained on

serve = [sys.executable, "-m", "algorithms.cli", "serve", args.model, "--port", str(args.port)]  # grpo-gym serve ...
server = subprocess.Popen(serve)
url = f"http://127.0.0.1:{args.port}"
try:
    for _ in range(600):  # the server loads the model, then answers /health
        try:
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 32, "temperature": 0}).json()
    print("prompt:", repr(prompt))
    print("answer:", repr(reply["choices"][0]["text"]))
finally:
    server.terminate()  # SIGTERM: the server finishes what it received, then exits
    server.wait(timeout=60)
    print(f"server stopped (exit {server.returncode}: {-signal.SIGTERM} is SIGTERM's, after the graceful shutdown)")
