"""`cramkit distill`: a fine-tuned teacher -> a small, fast student (BiLSTM or small encoder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cramkit import request
from cramkit.distillation.request import SETTINGS_HELP, DistillRequest, is_embedding_student
from cramkit.errors import CramkitError

EPILOG = """\
examples:
  cramkit distill --teacher out/sst2 --task glue/sst2 --data-dir glue --student bilstm --out out/sst2-bilstm
  cramkit distill --teacher out/sst2 --task glue/sst2 --student encoder --set layers=2 --out out/sst2-l2
  cramkit distill --teacher out/rev --train train.csv --dev dev.csv --text-a review --label stars \\
      --student bilstm --unlabelled more_reviews.txt --out out/rev-bilstm
  cramkit distill --teacher hf:all-MiniLM-L6-v2 --student layers:3 --unlabelled sentences.txt --out mini-l3

an embedding student (--student layers:N): N of an embedding teacher's layers (evenly spaced, the first and
the last kept; --set layer_map=0,2,4 to choose), trained on the --unlabelled texts alone to give the
teacher's vectors (1 - cosine, also on the leading Matryoshka dimensions: --set matryoshka=128,64 or the
teacher's own); a held-out slice (--set held_out=N) scores its agreement with the teacher; the output is an
embedding model (cramkit embed, serve, export).

the transfer set follows Tang et al. 2019 (p_mask 0.1, p_pos 0.1, p_ng 0.25, n_iter 20 / 10 for pairs);
the loss is MSE on the logits (--set loss=kl --set temperature=2 --set alpha=0.5 for KL mixed with the
labels). The transfer set and the teacher's logits are cached in --cache (default OUT/cache): reuse
it across students and reruns; an interrupted teacher pass resumes where it stopped. Each student trains
in OUT/runs/distilled and OUT/runs/labels-only (checkpoints every checkpoint_every, metrics.jsonl,
loss.png): the same command run again after a kill or Ctrl-C resumes from the latest checkpoint, and
finished work is not redone; other settings on the same --out are refused (use another --out).
settings (--set KEY=VALUE): augment, p_mask, p_pos, p_ng, n_iter, max_ngram, workers, max_train_examples,
max_unlabelled, loss, temperature, alpha, hidden_weight, epochs, lr, batch_size, weight_decay, schedule, max_length,
baseline, baseline_epochs, seed, device, precision, threads, checkpoint_every, speed_seconds, speed_examples,
embedding_dim, lstm_hidden, fc_hidden, dropout, init_embeddings, layers, hidden, layer_map, init, matryoshka,
held_out

POS replacement needs NLTK's tagger: python -c "import nltk; nltk.download('averaged_perceptron_tagger_eng')".
"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "distill",
        help="distil a fine-tuned model into a small fast student (BiLSTM or small encoder)",
        description="Distil a fine-tuned teacher into a BiLSTM (Tang et al. 2019) or a small encoder on an "
        "augmented transfer set; write the student (cramkit.load / predict / export) with report.json and "
        "report.md: teacher, student and labels-only scores, parameters, CPU examples/s.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    request.add_arguments(
        p, DistillRequest, helps={"overrides": SETTINGS_HELP, "progress": "no progress bars"}, skip=("settings",)
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a settings file (what --print-config writes: distill: and its fields); --set goes on top",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved settings (as YAML) and exit; nothing runs"
    )
    p.add_argument("--request", metavar="FILE.yaml", help=argparse.SUPPRESS)  # torchrun's workers: the request
    p.add_argument(
        "--nproc",
        type=int,
        default=1,
        metavar="N",
        help="training processes on this machine (starts torchrun; DDP, one per GPU)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import cramkit

    if args.request is not None:  # a torchrun worker: the request the launcher wrote, as it is
        req = request.read_request(DistillRequest, args.request, "distill")
    else:
        req = request.from_args(DistillRequest, args)
        if args.config is not None:
            from cramkit.config import section_file

            req.settings = section_file(args.config, "distill")
    if args.print_config:
        import yaml

        from cramkit.config import to_dict

        student, cfg = req.resolve()
        print(yaml.safe_dump({"distill": to_dict(cfg.resolved(student))}, sort_keys=False), end="")
        return 0
    if args.nproc != 1:
        return _launch(args.nproc, req)
    rep = cramkit.distill(req)
    if not rep:  # under torchrun, a rank other than 0: rank 0 reports
        return 0
    if rep.get("kind") == "embedding":  # --student layers:N: its agreement with the teacher, one line
        print(rep["summary"])
        served = rep.get("served")
        fastest = served["export"] if served else rep["out"]
        hint = "" if served else f"; its fastest path here: cramkit export {rep['out']} --target cpu --out DIR"
        print(f"student saved in {rep['out']}: cramkit embed FILE --from {fastest} --out VECTORS{hint}")
        return 0
    print((Path(req.out) / "report.md").read_text(encoding="utf-8"))
    print(f"student saved in {rep['out']}: cramkit predict --from {rep['out']} FILE")
    return 0


def _launch(nproc: int, req: DistillRequest) -> int:
    """``--nproc N``: the request checked once (what would fail in every process fails here), written to a file
    that every one of N torchrun processes reads."""
    from cramkit.train.launch import launch_request

    if is_embedding_student(req.resolve()[0]):
        raise CramkitError(f"--student {req.student} trains in one process; drop --nproc")
    # the flags argparse requires, then the request that holds everything
    given = ["--teacher", str(req.teacher), "--student", req.student, "--out", str(req.out)]
    return launch_request(nproc, "distill", req, given)
