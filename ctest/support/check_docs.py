#!/usr/bin/python3
"""CTest docs_reference: what the README and docs/*.md show must exist.

    check_docs.py PARTRAIN SOURCE_DIR

Reads the commands and their flags from `partrain --help` and `partrain COMMAND --help` (CLI11's
"Subcommands:" and "Options:" sections) and the sections and keys of configs/example.toml (the file
that documents every key), then scans README.md and docs/*.md:
  - in code (fenced blocks and `inline spans`), every `partrain COMMAND` must name a command and every
    --flag after it on that command line must be one of that command's flags;
  - every `--set section.key=value`, every code span that is just `section.key[=value]` or `[section]`,
    and every `[section] key` must name a section and key of example.toml (section names that are not
    sections, such as the placeholder `section.key`, are not checked);
  - every link to a .md file (and its #anchor) must exist;
  - docs/configuration.md has a `## [section]` heading per section, whose table rows (| `key` | ...)
    name exactly the keys of that section of example.toml (the reference is complete and not stale).
It also checks the citations of the guides in the sources (`docs/NAME.md §Heading` in src/, kernels/,
ctest/, validation/, jobscripts/): the guide exists and has a heading that starts with Heading.
Prints one line per problem, naming the file and line, and exits 1 when there is any; 0 otherwise.
"""
import pathlib
import re
import subprocess
import sys
import tomllib

HELP_SECTION = re.compile(r"^(\w[\w ]*):\s*$")
PLACEHOLDER_COMMAND = re.compile(r"^[A-Z_]+$|^\.\.\.$")
LAUNCHERS = {"mpirun", "mpiexec", "srun"}
CODE_STOP_TOKENS = {"|", ";", "&&", "||", "#", "\\", "->"}


def run_help(partrain, *arguments):
    """The help text of `partrain ARGUMENTS --help` (CLI11 prints it on stdout and exits 0)."""
    result = subprocess.run([partrain, *arguments, "--help"], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        sys.exit(f"check_docs: {partrain} {' '.join(arguments)} --help failed ({result.returncode}):\n"
                 f"{result.stdout}{result.stderr}")
    return result.stdout


def help_sections(text):
    """{section title: [entry lines]} of a CLI11 help text."""
    sections, current = {}, None
    for line in text.splitlines():
        match = HELP_SECTION.match(line)
        if match and not line.startswith(" "):
            current = sections.setdefault(match.group(1), [])
        elif current is not None and line.startswith("  ") and line.strip():
            current.append(line)
    return sections


def help_flags(text):
    """The long flags (--name) of the Options section of a CLI11 help text."""
    flags = set()
    for line in help_sections(text).get("Options", []):
        specification = re.split(r"\s{2,}", line.strip())[0]  # "-h,--help" or "--set TEXT ..."
        flags.update(re.findall(r"--[\w-]+", specification.split(" ")[0]))
    return flags


def help_subcommands(text):
    return {line.split()[0] for line in help_sections(text).get("Subcommands", [])}


def read_cli(partrain):
    """(global flags, {command: flags}) from the program's help."""
    top = run_help(partrain)
    commands = help_subcommands(top)
    if not commands:
        sys.exit(f"check_docs: no Subcommands section in `{partrain} --help`:\n{top}")
    return help_flags(top), {command: help_flags(run_help(partrain, command)) for command in commands}


def slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def headings(path):
    return [match.group(1).strip() for match in re.finditer(r"(?m)^#{1,6}\s+(.+)$", path.read_text())]


def code_pieces(text):
    """(line number, code) for each line of a shell fenced block (```bash, ```sh, ```console) and each
    inline code span (a span may continue on the next line); a fenced line ending in a backslash
    continues on the next. Other fenced blocks (diagrams, folder trees) are not code to check."""
    pieces, in_fence, shell_fence, pending, pending_line = [], False, False, "", 0
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        line, number = lines[index], index + 1
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            shell_fence = in_fence and line.strip()[3:].strip() in {"bash", "sh", "console", "shell"}
            index += 1
            continue
        if in_fence and not shell_fence:
            index += 1
            continue
        if in_fence:
            start = number
            while line.rstrip().endswith("\\") and index + 1 < len(lines):
                index += 1
                line = line.rstrip()[:-1] + " " + lines[index]
            pieces.append((start, line))
            index += 1
            continue
        if pending:
            line, number = pending + " " + line, pending_line
        if line.count("`") % 2 == 1 and index + 1 < len(lines):
            pending, pending_line = line, number
            index += 1
            continue
        pending = ""
        for span in re.findall(r"`([^`]+)`", line):
            pieces.append((number, span))
        index += 1
    return pieces


def prose_lines(text):
    """(line number, line) outside fenced blocks."""
    in_fence = False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        elif not in_fence:
            yield number, line


class Checker:
    def __init__(self, source_dir, global_flags, command_flags, keys):
        self.source_dir = source_dir
        self.global_flags = global_flags
        self.command_flags = command_flags
        self.keys = keys  # {section: set of keys}
        self.problems = []
        self.checked_commands = 0  # partrain command lines read
        self.checked_keys = 0      # config key mentions read

    def problem(self, path, line, message):
        self.problems.append(f"{path.relative_to(self.source_dir)}:{line}: {message}")

    def check_key(self, path, line, section, key, how):
        if section not in self.keys:
            return  # not a config section (a placeholder such as section.key, or a file name)
        self.checked_keys += 1
        if key not in self.keys[section]:
            self.problem(path, line, f"{how}: [{section}] has no key '{key}' in configs/example.toml")

    def check_command_line(self, path, line, code):
        # One command line per segment; its program is partrain itself (a path ending in /partrain)
        # or a launcher (mpirun, mpiexec, srun) whose program is.
        for segment in re.split(r"\s(?:;|&&|\|\||\|)\s|;\s", code):
            tokens = [token for token in segment.split() if not re.match(r"^[A-Z_]+=", token)]
            if not tokens:
                continue
            if tokens[0] in LAUNCHERS:
                tokens = tokens[1:]
                while tokens and pathlib.PurePath(tokens[0].strip("[]`")).name != "partrain":
                    tokens = tokens[1:]
            if not tokens or pathlib.PurePath(tokens[0].strip("[]`")).name != "partrain":
                continue
            self.check_partrain_arguments(path, line, tokens[1:])

    def check_partrain_arguments(self, path, line, tokens):
        self.checked_commands += 1
        command = None
        if tokens:
            first = tokens[0].strip("[](),`")
            if not first.startswith("-"):
                if PLACEHOLDER_COMMAND.match(first):
                    return
                if first not in self.command_flags:
                    self.problem(path, line, f"`partrain {first}`: no such command "
                                             f"(partrain --help lists {', '.join(sorted(self.command_flags))})")
                    return
                command, tokens = first, tokens[1:]
        allowed = self.command_flags[command] if command else self.global_flags
        for token in tokens:
            if token in CODE_STOP_TOKENS or token.startswith("#"):
                break
            flag = token.strip("[](),`").split("=")[0]
            if flag.startswith("--") and len(flag) > 2 and flag not in allowed:
                where = f"partrain {command}" if command else "partrain"
                self.problem(path, line, f"`{where}` has no flag {flag} ({where} --help)")

    def check_code(self, path, line, code):
        self.check_command_line(path, line, code)
        for section, key in re.findall(r"--set[ =]+([a-z_]+)\.([a-z_0-9]+)=", code):
            self.check_key(path, line, section, key, f"--set {section}.{key}")
        whole = re.fullmatch(r"([a-z_]+)\.([a-z_0-9]+)(=\S*)?", code.strip())
        if whole:
            self.check_key(path, line, whole.group(1), whole.group(2), f"`{code.strip()}`")
        section_key = re.fullmatch(r"\[([a-z_]+)\] ([a-z_][a-z_0-9]*)( = .*)?", code.strip())
        if section_key:
            self.check_key(path, line, section_key.group(1), section_key.group(2), f"`{code.strip()}`")
        section_only = re.fullmatch(r"\[([a-z_]+)\]", code.strip())
        if section_only and section_only.group(1) not in self.keys:
            self.problem(path, line, f"`{code.strip()}`: configs/example.toml has no such section")

    def check_section_keys(self, path, line, text):
        for section, key in re.findall(r"\[([a-z_]+)\] ([a-z_][a-z_0-9]*)", text):
            self.check_key(path, line, section, key, f"[{section}] {key}")

    def check_links(self, path, line, text):
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+://", target):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            if not linked.exists():
                self.problem(path, line, f"link to {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in {slug(h) for h in headings(linked)}:
                self.problem(path, line, f"link to {target}: {linked.name} has no heading with anchor #{anchor}")

    def check_document(self, path):
        text = path.read_text()
        for line, code in code_pieces(text):
            self.check_code(path, line, code)
        for line, prose in prose_lines(text):
            self.check_section_keys(path, line, re.sub(r"`[^`]*`", "", prose))
            self.check_links(path, line, prose)

    def check_reference(self, path):
        """docs/configuration.md: one `## [section]` per section, its table rows = the section's keys."""
        section, documented = None, {}
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            heading = re.match(r"^## \[([a-z_]+)\]\s*$", line)
            if heading:
                section = heading.group(1)
                documented.setdefault(section, set())
                if section not in self.keys:
                    self.problem(path, number, f"## [{section}]: configs/example.toml has no such section")
                continue
            if line.startswith("## "):
                section = None
            row = re.match(r"^\|\s*`([a-z_0-9]+)`\s*\|", line)
            if row and section:
                documented[section].add(row.group(1))
                self.check_key(path, number, section, row.group(1), "reference table")
        for name, keys in self.keys.items():
            missing = sorted(keys - documented.get(name, set()))
            if name not in documented:
                self.problem(path, 1, f"no `## [{name}]` section for configs/example.toml's [{name}]")
            elif missing:
                self.problem(path, 1, f"[{name}] keys of configs/example.toml not documented: {', '.join(missing)}")

    def check_citations(self):
        """`docs/NAME.md §Heading` in the sources: the guide and a heading starting with Heading exist."""
        leader = re.compile(r"^\s*(?:///?|#|\*)?\s?")
        citation = re.compile(r"(?<![\w/.])(?:\.\./)*docs/([\w-]+\.md)(?:\)?[ \t]*§[ \t]*([^,;:)]+))?")
        for folder in ("src", "kernels", "ctest", "validation", "jobscripts"):
            for path in sorted((self.source_dir / folder).rglob("*")):
                if path.name == "check_docs.py":
                    continue  # this file's docstring names the pattern itself
                if any(part.startswith(".") for part in path.relative_to(self.source_dir).parts):
                    continue  # git-ignored venvs (validation/golden/.venv): other projects' files
                if not path.is_file() or path.suffix not in {".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".md", ".txt"}:
                    continue
                lines = path.read_text(errors="replace").splitlines()
                for index, line in enumerate(lines):
                    if "docs/" not in line:
                        continue
                    # A citation may continue on the next comment line: read the two as one.
                    following = leader.sub("", lines[index + 1]) if index + 1 < len(lines) else ""
                    joined = line + " " + following
                    for match in citation.finditer(joined):
                        if match.start() >= len(line):
                            break
                        self.check_citation(path, index + 1, match.group(1), match.group(2))

    def check_citation(self, path, line, guide_name, heading):
        guide = self.source_dir / "docs" / guide_name
        if not guide.exists():
            self.problem(path, line, f"cites docs/{guide_name}, which does not exist")
        elif heading and not any(h.startswith(heading.strip()) for h in headings(guide)):
            self.problem(path, line, f"cites docs/{guide_name} §{heading.strip()}: no such heading")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    partrain, source_dir = sys.argv[1], pathlib.Path(sys.argv[2]).resolve()
    global_flags, command_flags = read_cli(partrain)
    with open(source_dir / "configs" / "example.toml", "rb") as file:
        example = tomllib.load(file)
    keys = {section: set(table) for section, table in example.items() if isinstance(table, dict)}
    checker = Checker(source_dir, global_flags, command_flags, keys)
    documents = [source_dir / "README.md", *sorted((source_dir / "docs").glob("*.md"))]
    for path in documents:
        checker.check_document(path)
    checker.check_reference(source_dir / "docs" / "configuration.md")
    checker.check_citations()
    for problem in checker.problems:
        print(problem)
    print(f"check_docs: {len(documents)} documents, {len(command_flags)} commands, "
          f"{sum(len(k) for k in keys.values())} config keys; read {checker.checked_commands} partrain command lines "
          f"and {checker.checked_keys} key mentions; {len(checker.problems)} problems")
    return 1 if checker.problems else 0


if __name__ == "__main__":
    sys.exit(main())
