"""The chunkernels command: list, describe, check and benchmark registered kernels, and the demo."""

from __future__ import annotations

import argparse
import sys

from chunkernels import __version__
from chunkernels._cli_args import add_cluster_arguments, cluster_from_args, whole_number


#: ``chunkernels list`` fits a terminal this wide.
LIST_WIDTH = 100


def _list(args) -> int:
    print(_list_table())
    return 0


def _list_table(width: int = LIST_WIDTH) -> str:
    """The registry as text no wider than ``width`` columns: one row per kernel, its halo rule on
    the lines below the row (wrapped), since a rule is a sentence and the other columns are words.
    """
    import textwrap

    from chunkernels._registry import get, registered

    header = ("name", "kind", "ndim", "dtypes (GPU path)", "CUDA source")
    rows, halos = [], []
    for name in registered():
        s = get(name)
        rows.append((name, s.kind, s.ndim_text, _short_dtypes(s.dtypes),
                     s.source or ("inline" if s.code else "-")))
        halos.append(s.halo_rule)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    indent = " " * (widths[0] + 2)
    lines = ["  ".join(c.ljust(w) for c, w in zip(header, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    for row, halo in zip(rows, halos):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        lines += textwrap.wrap(f"halo: {halo}", width, initial_indent=indent,
                               subsequent_indent=indent + "      ", break_on_hyphens=False)
    return "\n".join(lines)


def _short_dtypes(dtypes) -> str:
    """Dtype names grouped by kind: ``float32/64``, a run of every size as ``int8-64``, signed
    and unsigned integers of the same sizes as ``(u)int8-64``; ``bool`` and others as they are.
    """
    import re

    sizes: dict[str, list[int]] = {}
    for name in dtypes:
        kind, bits = re.fullmatch(r"([a-z]+?)(\d*)", name).groups()
        sizes.setdefault(kind, []).extend([int(bits)] if bits else [])

    def text(kind: str) -> str:
        bits = sorted(sizes.pop(kind))
        if not bits:
            return kind
        if len(bits) > 2 and all(b * 2 == c for b, c in zip(bits, bits[1:])):
            return f"{kind}{bits[0]}-{bits[-1]}"
        return kind + "/".join(map(str, bits))

    parts = []
    if "bool" in sizes:
        parts.append(text("bool"))
    if sorted(sizes.get("int", [None])) == sorted(sizes.get("uint", [])):
        sizes.pop("uint")
        parts.append("(u)" + text("int"))
    parts += [text(kind) for kind in ("int", "uint", "float", "complex") if kind in sizes]
    parts += [text(kind) for kind in list(sizes)]
    return ", ".join(parts)


def _describe(args) -> int:
    from chunkernels._registry import describe

    for name in args.names:
        print(describe(name))
        print()
    return 0


def _check_progress():
    """A ``check`` progress callback: one line per kernel on stderr, with its time."""
    import time

    last = [time.perf_counter()]

    def report(name, results):
        now = time.perf_counter()
        status = ", ".join(f"{r.path}: {r.status}" for r in results)
        print(f"checked {name} in {now - last[0]:.1f} s ({status})", file=sys.stderr, flush=True)
        last[0] = now

    return report


def _check(args) -> int:
    from chunkernels.check import check, format_table

    gpu = False if args.cpu_only else None
    with cluster_from_args(args):
        results = check(args.names or None, seed=args.seed, gpu=gpu, progress=_check_progress())
    print(format_table(results))
    if not any(r.path.startswith("gpu") and r.cases for r in results):
        why = "--cpu-only given" if args.cpu_only else "no CUDA GPU found (CuPy missing or no device)"
        print(f"\nGPU part skipped: {why}; the CPU path was checked.")
    failed = [r for r in results if r.status == "FAIL"]
    print(f"\n{sum(r.status == 'pass' for r in results)} passed, {len(failed)} failed")
    return 1 if failed else 0


def _bench(args) -> int:
    from chunkernels import bench

    return bench.main(args)


def _demo(args) -> int:
    from chunkernels import demo

    return demo.run(args)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="chunkernels", description=__doc__)
    parser.add_argument("--version", action="version", version=f"chunkernels {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="print the kernel registry")
    p.set_defaults(run=_list)

    p = sub.add_parser("describe", help="print kernels' specs")
    p.add_argument("names", nargs="+", metavar="NAME")
    p.set_defaults(run=_describe)

    p = sub.add_parser("check", help="validate kernels against their CPU references")
    p.add_argument("names", nargs="*", metavar="NAME", help="kernels to check (default: all)")
    p.add_argument("--seed", type=whole_number, default=0,
                   help="random seed for the inputs (a whole number, 0 or more)")
    p.add_argument("--cpu-only", action="store_true", help="skip the GPU path even with a GPU")
    add_cluster_arguments(p)
    p.set_defaults(run=_check)

    p = sub.add_parser("bench", help="benchmark kernels side by side with peers (needs a GPU)")
    from chunkernels import bench

    bench.add_arguments(p)
    p.set_defaults(run=_bench)

    p = sub.add_parser("demo", help="find the sources of an image (the GPU lesson's four steps), "
                                    "chunked on a local cluster, validated against the CPU")
    from chunkernels import demo

    demo.add_arguments(p)
    p.set_defaults(run=_demo)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (KeyError, ValueError, TypeError) as exc:
        from chunkernels._errors import UnknownKernelError

        if isinstance(exc, UnknownKernelError):
            print(f"chunkernels: {exc}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
