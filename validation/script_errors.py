"""Bad input to the validation scripts: one line "<script>: error: <message>" on stderr and exit
status 2 (as argparse answers bad arguments), never a Python traceback. The checks run before the
optional libraries are imported, so a wrong path is reported even where h5py or torch is missing."""
import argparse
import os
import sys


def fail(message):
    """Prints "<script>: error: message" to stderr and exits with status 2."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, but a bad command line (an unknown option, a value of the wrong type or
    choice) is answered like any other bad input: one line "<script>: error: ..." and status 2."""

    def error(self, message):
        fail(message)


def require_file(path, what):
    """Fails unless `path` is a readable file; `what` names the argument ("CHECKPOINT", "--data")."""
    if not os.path.isfile(path):
        fail(f"{what} {path}: no such file" + (" (a directory)" if os.path.isdir(path) else ""))
    if not os.access(path, os.R_OK):
        fail(f"{what} {path}: not readable")


def require_executable(path, what):
    """Fails unless `path` is an executable file; `what` names the argument ("--partrain")."""
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        fail(f"{what} {path}: no such executable (build it: cmake --build --preset cpu --target partrain)")


def require_directory(path, what):
    """Fails unless `path` is an existing directory."""
    if not os.path.isdir(path):
        fail(f"{what} {path}: no such directory")


def read_json(path, what):
    """The JSON file `path`; fails naming the file when it is missing or not JSON."""
    import json
    require_file(path, what)
    try:
        with open(path) as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        fail(f"{what} {path}: not JSON: {error}")


def require_output_directory(path, what):
    """Fails unless the directory that would hold the output file `path` exists."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        fail(f"{what} {path}: no directory {directory} to write it in")


def open_hdf5(h5py, path, what):
    """`path` opened read-only with h5py; fails naming the file when it is not HDF5."""
    require_file(path, what)
    try:
        return h5py.File(path, "r")
    except OSError as error:
        fail(f"{what} {path}: not an HDF5 file ({error})")


def read_toml(path, what):
    """The TOML file `path` as a dict; fails naming the file (and line) when it is missing or not TOML."""
    import tomllib
    require_file(path, what)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as error:
        fail(f"{what} {path}: not TOML: {error}")
