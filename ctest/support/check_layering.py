#!/usr/bin/env python3
"""Checks the include layering of src/ and kernels/ (docs/architecture.md §The layering rule).

A folder of src/ includes only from its own layer or lower ones:

    core -> graph, comm -> io, kernels -> models -> plan, profile -> partition, runtime -> app

and partition/ and runtime/ never include each other. Inside src/partition/, no include points up:
a file in a subfolder never includes partition/planner.h (the dispatcher on top), common/ includes
no paper folder (rannc, tarnawski, merak, capslog, baselines), and a paper folder includes no other
paper folder. Prints every offending include as file:line and exits 1; exits 0 when there is none.

Usage: check_layering.py [REPOSITORY_ROOT]   (default: the repository holding this script)
"""
import pathlib
import re
import sys

# Layer of each top-level folder: an include may point to the same layer or a lower one.
LAYERS = {
    "core": 0,
    "graph": 1, "comm": 1,
    "io": 2, "kernels": 2,
    "models": 3,
    "plan": 4, "profile": 4,
    "partition": 5, "runtime": 5,
    "app": 6,
}
# Folders of one layer that must not include each other.
FORBIDDEN_SIBLINGS = {("partition", "runtime"), ("runtime", "partition")}
PAPER_FOLDERS = {"rannc", "tarnawski", "merak", "capslog", "baselines"}
SOURCE_SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def folder_of_source(root, path):
    """The top-level folder of a source file ("core", "kernels", ...) and its path under it."""
    relative = path.relative_to(root).parts
    if relative[0] == "src":
        return relative[1], relative[2:]
    return relative[0], relative[1:]  # kernels/...


def resolve(root, path, target):
    """The file an include names: relative to the including file first, then src/ and the root."""
    for base in (path.parent, root / "src", root):
        candidate = (base / target).resolve()
        if candidate.is_file():
            return candidate
    return None


def partition_part(parts):
    """Inside src/partition/: the subfolder ("common", "rannc", ...) or "" for the top level."""
    return parts[0] if len(parts) > 1 else ""


def problems_of(root):
    problems = []
    files = [p for base in (root / "src", root / "kernels") if base.is_dir()
             for p in sorted(base.rglob("*")) if p.suffix in SOURCE_SUFFIXES and p.is_file()]
    for path in files:
        folder, parts = folder_of_source(root, path)
        if folder not in LAYERS:
            problems.append(f"{path.relative_to(root)}: folder '{folder}' has no layer in check_layering.py")
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            target = resolve(root, path, match.group(1))
            if target is None:
                continue  # a system or generated header
            try:
                target_folder, target_parts = folder_of_source(root, target)
            except ValueError:
                continue  # outside the repository
            where = f"{path.relative_to(root)}:{number}"
            shown = target.relative_to(root)
            if target_folder not in LAYERS:
                continue  # ctest/support or other non-library code is not layered here
            if LAYERS[target_folder] > LAYERS[folder]:
                problems.append(f"{where}: {folder}/ (layer {LAYERS[folder]}) includes {shown} "
                                f"from {target_folder}/ (layer {LAYERS[target_folder]}), a higher layer")
            elif (folder, target_folder) in FORBIDDEN_SIBLINGS:
                problems.append(f"{where}: {folder}/ includes {shown}; {folder}/ and {target_folder}/ "
                                f"must not include each other")
            elif folder == "partition" and target_folder == "partition":
                source_part, target_part = partition_part(parts), partition_part(target_parts)
                if source_part and not target_part:
                    problems.append(f"{where}: partition/{source_part}/ includes {shown}, which is "
                                    f"above it (the dispatcher); use partition/common/")
                elif source_part == "common" and target_part in PAPER_FOLDERS:
                    problems.append(f"{where}: partition/common/ includes {shown} from the paper "
                                    f"folder partition/{target_part}/")
                elif (source_part in PAPER_FOLDERS and target_part in PAPER_FOLDERS
                      and source_part != target_part):
                    problems.append(f"{where}: partition/{source_part}/ includes {shown} from "
                                    f"another paper folder, partition/{target_part}/")
    return problems, len(files)


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[2]).resolve()
    problems, count = problems_of(root)
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} include(s) break the layering (docs/architecture.md §The layering rule)")
        return 1
    print(f"layering: {count} files checked, no include points to a higher layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
