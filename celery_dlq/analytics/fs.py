"""Files of the analytics pipeline on any pyarrow filesystem: a local path or a URI (``s3://``, ``s3a://``)."""
from __future__ import annotations

import os

import pyarrow.fs as pafs


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """``(filesystem, path)`` of a local path or a URI (``s3a://`` is read as ``s3://``)."""
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3a://"):
        uri = "s3://" + uri[len("s3a://"):]
    return pafs.FileSystem.from_uri(uri)


def write_bytes(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    """Write a whole small file, replacing it (by rename where the filesystem has one)."""
    fs.create_dir(os.path.dirname(path) or ".", recursive=True)
    tmp = f"{os.path.dirname(path)}/_tmp-{os.getpid()}-{os.path.basename(path)}"
    with fs.open_output_stream(tmp) as out:
        out.write(data)
    fs.move(tmp, path)


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes | None:
    """A whole small file, or None if there is none."""
    if fs.get_file_info(path).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(path) as stream:
        return stream.read()
