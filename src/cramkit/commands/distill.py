"""`cramkit distill`: a fine-tuned teacher -> a small, fast student (BiLSTM or small encoder)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cramkit.commands.checks import add_file_task_args, add_training_args

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
    p.add_argument(
        "--teacher",
        required=True,
        metavar="MODEL",
        help="a fine-tuned model directory (cramkit finetune --out) or hf:DIR with a classification head",
    )
    p.add_argument(
        "--student",
        required=True,
        metavar="NAME",
        help="bilstm, encoder (the teacher's layers), a pretrained small model to start from (hf:DIR, e.g. "
        "all-MiniLM-L6-v2, or a model directory: all of its layers), or layers:N: an embedding student, N of an "
        "embedding teacher's layers trained on --unlabelled text to give its vectors",
    )
    p.add_argument("--out", required=True, help="output directory: the student model, report.json, report.md")
    p.add_argument("--task", help="registered task name, e.g. glue/sst2")
    p.add_argument("--data-dir", help="GLUE root folder; default $CRAMKIT_GLUE_DIR")
    add_file_task_args(p, dev="dev file, scored for teacher and student", held_out=False)
    p.add_argument(
        "--unlabelled",
        metavar="FILE_OR_STORE",
        help="extra text for the transfer set: a UTF-8 text file (one text per line) or a token store "
        "(its documents, decoded and cut into sentences; --set max_unlabelled=N); with --student layers:N, "
        "the only text the embedding student learns from",
    )
    p.add_argument("--cache", help="folder for the transfer set and teacher logits (default OUT/cache)")
    p.add_argument(
        "--config",
        metavar="FILE",
        help="a settings file (what --print-config writes: distill: and its fields); --set goes on top",
    )
    p.add_argument(
        "--print-config", action="store_true", help="print the resolved settings (as YAML) and exit; nothing runs"
    )
    add_training_args(
        p,
        "a distillation setting, e.g. --set epochs=5 --set layers=2 --set p_pos=0",
        nproc="training processes on this machine (starts torchrun; DDP, one per GPU)",
        progress="no progress bars",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cramkit.config import parse_overrides, section_file, to_dict
    from cramkit.distillation.config import config_from
    from cramkit.distillation.verb import check_student, distill  # distill is cramkit.distill(...)

    settings = section_file(args.config, "distill") if args.config else {}
    settings.update(parse_overrides(args.overrides))  # --set on top of the file, as in finetune and pretrain
    if args.print_config:
        import yaml

        check_student(args.student)
        cfg = config_from(settings).resolved(args.student)
        print(yaml.safe_dump({"distill": to_dict(cfg)}, sort_keys=False), end="")
        return 0
    if args.nproc != 1:  # what would fail in every process fails here once: the student, the settings
        check_student(args.student)
        if args.student.startswith("layers:"):
            from cramkit.errors import CramkitError

            raise CramkitError(f"--student {args.student} trains in one process; drop --nproc")
        config_from(settings)
        from cramkit.train.launch import relaunch

        return relaunch(args.nproc, args.argv)
    rep = distill(
        args.teacher,
        student=args.student,
        out=args.out,
        task=args.task,
        data_dir=args.data_dir,
        train=args.train,
        dev=args.dev,
        text_a=args.text_a,
        text_b=args.text_b,
        label=args.label,
        regression=args.regression,
        unlabelled=args.unlabelled,
        cache=args.cache,
        progress=not args.no_progress,
        report_to=args.report_to,
        **settings,
    )
    if not rep:  # under torchrun, a rank other than 0: rank 0 reports
        return 0
    if rep.get("kind") == "embedding":  # --student layers:N: its agreement with the teacher, one line
        print(rep["summary"])
        print(f"student saved in {rep['out']}: cramkit embed FILE --from {rep['out']} --out VECTORS")
        return 0
    print((Path(args.out) / "report.md").read_text(encoding="utf-8"))
    print(f"student saved in {rep['out']}: cramkit predict --from {rep['out']} FILE")
    return 0
