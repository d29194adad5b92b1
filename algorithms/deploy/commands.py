"""``grpo-gym distill``, ``grpo-gym quantize`` and ``grpo-gym serve``: the deployment commands of the command line."""

from __future__ import annotations

import argparse
import os
import shlex
from pathlib import Path
from typing import Any

from algorithms.cli_arguments import add_config_arguments
from algorithms.cli_types import COUNT, HOST, NON_NEGATIVE, PORT, POSITIVE, SEED, SHARE, VERBOSITY, Integer


def size_on_disk(path: str | os.PathLike) -> int:
    """Bytes of a file, or of every file under a folder."""
    location = Path(path)
    if location.is_file():
        return location.stat().st_size
    return sum(p.stat().st_size for p in location.rglob("*") if p.is_file())


def _student(text: str) -> Any:
    """``--student``: an inline JSON object of config fields, else a name, folder or JSON file."""
    if text.lstrip().startswith("{"):
        from grpo_gym.validation import read_json

        return read_json(text, "--student", fix="""write an object of config fields, e.g. '{"hidden_size": 64}'""")
    return text


def distill_command(args: argparse.Namespace) -> int:
    """Distil ``--teacher`` into ``--student`` on the config's env, then print held-out success and sizes."""
    from algorithms.common.env_util import make_env
    from algorithms.common.evaluation import evaluate_problems, format_table, held_out_problems
    from algorithms.common.hyperparams import load_hyperparams
    from algorithms.common.model.tokenizer_check import has_tokenizer
    from algorithms.common.saving.checkpoints import check_writable_file
    from algorithms.deploy.distill import distill, student_paths
    from algorithms.deploy.loading import load_policy
    from grpo_gym.validation import check_int

    student_config = _student(args.student)  # an inline JSON object is read before any work
    check_int("--n", args.n, low=1, allow_none=True)  # the numbers distill() does not check itself: before any work
    check_int("--eval-seed", args.eval_seed, low=0)
    if args.save_path is not None:  # the outputs' places, before any work: new, or replaced only with --overwrite
        zip_path, folder, int8_folder = student_paths(check_writable_file(args.save_path))
        for output in (folder, int8_folder) if args.int8_qat else (folder,):
            check_output_folder(output, args.teacher, args.overwrite)
        check_not_source(zip_path, args.teacher)
        if zip_path.exists() and not args.overwrite:
            raise ValueError(f"--save-path {os.fspath(zip_path)!r} exists; choose a new name, or pass --overwrite")
    config = load_hyperparams(args.config, args.env, args.preset, {})
    env_kwargs = dict(config.get("env_kwargs", {}))
    if has_tokenizer(args.teacher):  # a Hugging Face teacher brings its tokenizer; the env must use it
        env_kwargs.setdefault("tokenizer", args.teacher)
    env = make_env(args.env, 1, env_kwargs, args.seed)
    student = distill(
        args.teacher,
        student_config,
        env,
        steps=args.steps,
        batch_size=args.batch_size,
        learning_rate=args.learning_rate,
        temperature=args.temperature,
        reverse_kl=args.reverse_kl,
        on_policy=args.on_policy,
        sft_coef=args.sft_coef,
        int8_qat=args.int8_qat,
        qat_start=args.qat_start,
        save_path=args.save_path,
        tensorboard_log=args.tensorboard_log,
        progress_bar=args.progress_bar,
        verbose=args.verbose,
        seed=args.seed,
    )
    n = args.n or int(config.get("eval_problems", 100))
    problems = held_out_problems(env, n, float(env.get_attr("difficulty", indices=[0])[0]), args.eval_seed)
    budget = student.policy.max_new_tokens  # the env's completion length, for the folders' policies
    policies = {"teacher": load_policy(args.teacher, max_new_tokens=budget)[0], "student": student.policy}
    written = student_paths(args.save_path) if args.save_path else None
    if written is not None and args.int8_qat:
        policies["student int8"] = load_policy(written[2], max_new_tokens=budget)[0]
    print(format_table({name: [evaluate_problems(p, env, problems, args.eval_seed)] for name, p in policies.items()}))
    if written is not None:
        for path in (args.teacher, *written):
            if Path(path).exists():
                print(f"{size_on_disk(path) / 2**20:8.2f} MiB  {path}")
    return 0


def check_not_source(path: str | os.PathLike, source: str | os.PathLike) -> Path:
    """``path`` resolved, after checking that writing it replaces neither ``source`` (the model a command reads),
    nor a folder that holds it, nor the current folder or one that holds it; ``ValueError`` naming the fix."""
    text = os.fspath(path)
    if not text.strip():
        raise ValueError(f"--save-path {text!r} is empty; give the name of a new folder, e.g. model-int8")
    target, origin = Path(text).resolve(), Path(source).resolve()
    if target == origin or target in origin.parents:
        raise ValueError(
            f"--save-path {text!r} would replace the model it reads ({os.fspath(source)}) or the folder that holds "
            "it: choose another name"
        )
    here = Path.cwd().resolve()
    if target == here or target in here.parents:
        raise ValueError(f"--save-path {text!r} would replace the current folder or one that holds it: name a new one")
    return target


def check_output_folder(path: str | os.PathLike, source: str | os.PathLike, overwrite: bool = False) -> Path:
    """Where a command may write a folder, checked before any work: never ``source`` itself (nor a folder that holds
    it, nor the current folder, see :func:`check_not_source`), and in a folder that can be written; a file there, or
    a non-empty folder without ``overwrite``, is an error naming the path and the fix."""
    from algorithms.common.saving.checkpoints import check_writable_dir

    target = check_not_source(path, source)
    check_writable_dir(target.parent, "--save-path")
    if target.is_file():
        raise ValueError(f"--save-path {os.fspath(path)!r} is a file; give a folder path")
    if target.is_dir() and any(target.iterdir()) and not overwrite:
        raise ValueError(
            f"--save-path {os.fspath(path)!r} is a folder that is not empty; choose a new one, or pass --overwrite "
            "to replace it (its old contents are removed)"
        )
    return target


def quantize_command(args: argparse.Namespace) -> int:
    """Write the INT8 export of a float model (post-training quantisation, or a QAT-trained student's export) to a
    new folder (an existing one only with ``--overwrite``: replaced whole, atomically; never the model's own)."""
    from algorithms.common.saving.atomic import atomic_directory
    from algorithms.deploy.loading import load_policy
    from algorithms.deploy.quantize import int8_layers, quantize_int8, save_int8

    check_output_folder(args.save_path, args.model, args.overwrite)
    policy, tokenizer = load_policy(args.model, tokenizer=args.tokenizer)
    if int8_layers(policy.model):
        raise ValueError(
            f"{args.model} is an INT8 export already; pass a float model (a zip or a save_pretrained folder)"
        )
    quantized = quantize_int8(policy.model)
    with atomic_directory(args.save_path) as temporary:
        save_int8(quantized, temporary, tokenizer)
    folder = Path(args.save_path)
    print(f"{size_on_disk(args.model) / 2**20:8.2f} MiB  {args.model}")
    print(f"{size_on_disk(folder) / 2**20:8.2f} MiB  {folder} ({len(int8_layers(quantized))} INT8 layers)")
    return 0


def export_command(args: argparse.Namespace) -> int:
    """Write a saved model as a GGUF file (llama.cpp, Ollama, LM Studio) and an Ollama ``Modelfile`` beside it."""
    from algorithms.common.saving.gguf_export import MODELFILE, check_output, check_type
    from algorithms.deploy.loading import saved_algorithm

    algorithm = saved_algorithm(args.model)  # before any work: the input, the type, then the outputs
    check_type(args.type)
    target, _ = check_output(args.gguf, args.force)
    model = algorithm.load(args.model, rollout_engine="builtin", read_optimizer=False)
    written = model.save_gguf(os.fspath(target), args.type, force=args.force)
    print(f"{size_on_disk(args.model) / 2**20:8.2f} MiB  {args.model}")
    print(f"{size_on_disk(written) / 2**20:8.2f} MiB  {written} ({args.type.lower()})")
    print(f"llama.cpp: {shlex.join(['llama-cli', '-m', os.fspath(written)])}")
    create = shlex.join(["ollama", "create", written.stem, "-f", MODELFILE])
    print(f"Ollama:    cd {shlex.quote(os.fspath(written.parent))} && {create}")
    return 0


def serve_command(args: argparse.Namespace) -> int:
    """Serve a saved model over HTTP until SIGTERM or Ctrl-C."""
    try:
        from algorithms.deploy.server import ServerSettings, serve
    except ImportError as error:
        raise ValueError(f"serving needs FastAPI and uvicorn ({error}): pip install 'grpo-gym[serve]'") from None
    from grpo_gym.validation import check_int

    check_int("--threads", args.threads, low=1, allow_none=True)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    settings = ServerSettings(
        max_wait_ms=args.max_wait_ms,
        max_batch_tokens=args.max_batch_tokens,
        max_batch_size=args.max_batch_size,
        max_queue=args.max_queue,
        bucket_width=args.bucket_width,
        max_tokens_limit=args.max_tokens_limit,
        seed=args.seed,
        max_prompt_chars=args.max_prompt_chars,
        max_body_bytes=args.max_body_bytes,
    )
    serve(args.model, args.host, args.port, settings, args.tokenizer, args.device, args.drain_timeout, args.log_level)
    return 0


def add_deploy_commands(commands: Any) -> None:
    """Add ``distill``, ``quantize``, ``export`` and ``serve`` to the ``grpo-gym`` sub-command parsers."""
    d = commands.add_parser("distill", help="distil a trained model into a smaller student (--int8-qat: for INT8)")
    d.add_argument("--teacher", required=True, help="a GRPO zip (train --save-path) or a save_pretrained folder")
    d.add_argument("--student", required=True,
                   help="a built-in size, a model folder, a JSON file or an inline JSON object of config fields "
                        "over the tiny model, e.g. '{\"hidden_size\": 64, \"num_hidden_layers\": 2}'")  # fmt: skip
    d.add_argument("--steps", type=Integer(low=0), default=1000, help="gradient steps")
    d.add_argument("--batch-size", type=COUNT, default=32, help="prompts per step")
    d.add_argument("--learning-rate", type=POSITIVE, default=1e-3)
    d.add_argument("--temperature", type=POSITIVE, default=1.0, help="the KL's temperature tau")
    d.add_argument("--reverse-kl", type=SHARE, default=0.0, help="weight of KL(student||teacher) in the mix")
    d.add_argument("--on-policy", type=SHARE, default=0.0, help="share of completions sampled by the student")
    d.add_argument("--sft-coef", type=NON_NEGATIVE, default=0.0, help="weight of the gold solutions' NLL")
    d.add_argument("--int8-qat", action="store_true", help="train through INT8 rounding; also write the INT8 export")
    d.add_argument("--qat-start", type=SHARE, default=0.0, help="share of the steps before the INT8 rounding starts")
    d.add_argument("--save-path", default=None, help="student.zip; also writes student/ and student-int8/")
    d.add_argument("--overwrite", action="store_true", help="replace the student files --save-path names if they exist")
    d.add_argument("--n", type=COUNT, default=None, help="held-out problems in the final table (config: eval_problems)")
    d.add_argument("--tensorboard-log", "-tb", default=None, help="TensorBoard folder (tags under distill/)")
    d.add_argument("--seed", type=SEED, default=0)
    d.add_argument("--verbose", type=VERBOSITY, default=0)
    d.add_argument("--no-progress-bar", dest="progress_bar", action="store_false")
    add_config_arguments(d)
    d.set_defaults(func=distill_command)

    q = commands.add_parser("quantize", help="write the INT8 export of a float model (PTQ, or after --int8-qat)")
    q.add_argument("model", help="a GRPO zip or a save_pretrained folder")
    q.add_argument("--save-path", required=True, help="the INT8 export folder to write")
    q.add_argument("--tokenizer", default=None, help="tokenizer folder for a zip trained with a non-built-in one")
    q.add_argument("--overwrite", action="store_true", help="replace --save-path when it is a non-empty folder")
    q.set_defaults(func=quantize_command)

    e = commands.add_parser("export", help="write a saved model as a GGUF file for llama.cpp and Ollama")
    e.add_argument("model", help="a zip saved by grpo-gym train --save-path")
    e.add_argument("--gguf", required=True, help="the .gguf file to write (an Ollama Modelfile is written beside it)")
    e.add_argument("--type", default="f16", help="f32, f16, bf16, q8_0, q4_0, q4_1, q5_0 or q5_1 (default: f16)")
    e.add_argument("--force", action="store_true", help="replace the .gguf file and the Modelfile if they exist")
    e.set_defaults(func=export_command)

    s = commands.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API with dynamic batching")
    s.add_argument("model", help="a GRPO zip, a save_pretrained folder or an INT8 export folder")
    s.add_argument("--host", type=HOST, default="127.0.0.1", help="the address to listen on (0.0.0.0: every interface)")
    s.add_argument("--port", type=PORT, default=8000)
    s.add_argument("--max-wait-ms", type=NON_NEGATIVE, default=5.0, help="the longest a request waits for a batch")
    s.add_argument("--max-batch-tokens", type=COUNT, default=8192, help="rows x (longest prompt + largest max_tokens)")
    s.add_argument("--max-batch-size", type=COUNT, default=64, help="the most completions in a batch")
    s.add_argument("--max-queue", type=COUNT, default=512, help="completions waiting before 503 + Retry-After")
    s.add_argument("--bucket-width", type=COUNT, default=16, help="prompt-length bucket width, in tokens")
    s.add_argument("--max-tokens-limit", type=COUNT, default=256, help="the largest max_tokens a request may ask")
    s.add_argument(
        "--max-prompt-chars",
        type=COUNT,
        default=None,
        help="the most characters of a prompt, checked before tokenizing (default: 64 per window token)",
    )
    s.add_argument("--max-body-bytes", type=COUNT, default=8 * 2**20, help="the largest request body (413 beyond)")
    s.add_argument("--tokenizer", default=None, help="tokenizer folder for a zip trained with a non-built-in one")
    s.add_argument("--device", default="cpu")
    s.add_argument("--threads", type=COUNT, default=None, help="torch threads (default: torch's)")
    s.add_argument("--seed", type=SEED, default=0, help="seeds the sampler")
    s.add_argument("--drain-timeout", type=NON_NEGATIVE, default=30.0, help="seconds to finish requests after SIGTERM")
    s.add_argument("--log-level", default="info")
    s.set_defaults(func=serve_command)
