"""What Discord attachments become in the text the model reads. Pure functions over plain
values; no discord import (the adapter downloads and hands over names, types and bytes).

Invariants:
- A text attachment (``text/*``, JSON/XML/YAML, or a known source/text file extension;
  Discord's ``message.txt`` from a long paste included) is decoded as UTF-8 (bad bytes
  replaced) and added to the message under its name, in order, within ``budget`` characters
  in total; what does not fit is cut and says so in the note.
- An image is never read as text; the text names it (``[image: name]``). With vision
  (``llm.vision``) up to ``MAX_IMAGES`` images of at most ``MAX_IMAGE_BYTES`` go to the model
  as data URLs (``image_url``); otherwise the person gets a short note with the real reason
  (vision off, too large, past the count, a type not read), and an image past the count is
  not downloaded. An image is known by its type, or by its extension when Discord sends no
  type. Other files become ``[file: name]`` with a note (a text file over the size: "too
  large", not "only text files"). Nothing is silently dropped: every attachment leaves a trace
  in the text. ``merge_notes`` says a cut once when the responder says it too.
- Files larger than ``MAX_TEXT_BYTES`` are not downloaded.
- Outbound (``fit_uploads``): every upload message holds at most ``FILES_PER_MESSAGE`` files
  and at most ``limit`` bytes in total. A file over the limit is gzip-compressed; if it is
  still over, the compressed bytes are cut into numbered pieces (``.partNofM``, joined again
  with ``cat``). The note says which, so the person knows what they got.
"""

from __future__ import annotations

import base64
import gzip
from dataclasses import dataclass
from pathlib import PurePosixPath

MAX_TEXT_BYTES = 1_000_000
MAX_IMAGES = 4
MAX_IMAGE_BYTES = 8_000_000
IMAGE_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")
TEXT_TYPES = ("application/json", "application/xml", "application/x-yaml", "application/yaml")
TEXT_EXTENSIONS = frozenset(
    [
        "txt",
        "md",
        "rst",
        "log",
        "csv",
        "tsv",
        "json",
        "yaml",
        "yml",
        "toml",
        "ini",
        "cfg",
        "conf",
        "xml",
        "html",
        "css",
        "py",
        "js",
        "ts",
        "c",
        "h",
        "cc",
        "cpp",
        "hpp",
        "rs",
        "go",
        "java",
        "kt",
        "rb",
        "php",
        "sh",
        "sql",
        "lua",
    ]
)
IMAGES_NOT_READ = "images are not read (vision is off), only the text"
IMAGES_TOO_BIG = "{names} over {mb} MB: not read"
IMAGES_TOO_MANY = "only the first {n} images are read; {names} not read"
IMAGES_UNKNOWN = "{names}: an image type I cannot read"
FILES_NOT_READ = "only text files are read; {names} not read"
TEXT_TOO_BIG = "{names} over {mb} MB: not read"
CUT = "the attached text was long; I read only its beginning"
IMAGE_EXTENSIONS = {"png": "image/png", "jpg": "image/jpeg", "jpeg": "image/jpeg",
                    "webp": "image/webp", "gif": "image/gif"}  # fmt: skip
FILES_PER_MESSAGE = 10  # Discord's limit per message
UPLOAD_HEADROOM = 4096  # multipart framing and the JSON payload share the request limit


@dataclass(frozen=True, slots=True)
class Incoming:
    """One attachment as the adapter sees it."""

    filename: str
    content_type: str | None
    size: int


def _suffix(att: Incoming) -> str:
    return PurePosixPath(att.filename.lower()).suffix.lstrip(".")


def kind(att: Incoming) -> str:
    """``text``, ``image`` or ``file`` (by the content type, else by the name's extension:
    Discord leaves ``content_type`` out for some uploads)."""
    ctype = (att.content_type or "").split(";")[0].strip().lower()
    if ctype.startswith("image/") or (not ctype and _suffix(att) in IMAGE_EXTENSIONS):
        return "image"
    if ctype.startswith("text/") or ctype in TEXT_TYPES:
        return "text"
    if PurePosixPath(att.filename.lower()).suffix.lstrip(".") in TEXT_EXTENSIONS:
        return "text"
    return "file"


def wants_bytes(att: Incoming, *, vision: bool = False, images_taken: int = 0) -> bool:
    """Whether to download ``att``: only what ``merge`` will use (``images_taken``: images
    of the same message already to be downloaded; past ``MAX_IMAGES`` none is)."""
    if kind(att) == "image":
        return (
            vision
            and images_taken < MAX_IMAGES
            and att.size <= MAX_IMAGE_BYTES
            and image_type(att) in IMAGE_TYPES
        )
    return kind(att) == "text" and att.size <= MAX_TEXT_BYTES


def image_type(att: Incoming) -> str:
    ctype = (att.content_type or "").split(";")[0].strip().lower()
    return ctype or IMAGE_EXTENSIONS.get(_suffix(att), "")


def merge_notes(said: str | None, own: str | None) -> str | None:
    """The responder's note and the attachments' note as one: "the attached text was long"
    is left out when the responder already says the message was cut (one thing, said once)."""
    if said and own and "read only its beginning" in said:
        own = own.replace(f"{CUT}; ", "").replace(f"; {CUT}", "").replace(CUT, "") or None
    return "; ".join(n for n in (said, own) if n) or None


def data_url(att: Incoming, data: bytes) -> str:
    return f"data:{image_type(att)};base64,{base64.b64encode(data).decode('ascii')}"


def merge(
    text: str,
    attachments: list[tuple[Incoming, bytes | None]],
    *,
    budget: int,
    vision: bool = False,
) -> tuple[str, str | None, tuple[str, ...]]:
    """The message text with its attachments, a short note for the person (or None), and the
    images for a vision model (data URLs of the image attachments that were downloaded). The
    note gives the real reason a file was not read: vision off, too large, one image too
    many, a type that is not read."""
    parts = [text] if text else []
    images: list[str] = []
    notes: list[str] = []
    skipped: list[str] = []
    big_images: list[str] = []
    extra_images: list[str] = []
    odd_images: list[str] = []
    big_texts: list[str] = []
    seen_images = 0
    left = budget
    cut = False
    for att, data in attachments:
        what = kind(att)
        if what == "image":
            parts.append(f"[image: {att.filename}]")
            seen_images += 1
            if data is not None and len(images) < MAX_IMAGES:
                images.append(data_url(att, data))
            elif not vision:
                if IMAGES_NOT_READ not in notes:
                    notes.append(IMAGES_NOT_READ)
            elif seen_images > MAX_IMAGES:
                extra_images.append(att.filename)
            elif att.size > MAX_IMAGE_BYTES:
                big_images.append(att.filename)
            else:
                odd_images.append(att.filename)  # a type we do not send, or a failed download
            continue
        if what == "text" and data is None and att.size > MAX_TEXT_BYTES:
            parts.append(f"[file: {att.filename}]")
            big_texts.append(att.filename)
            continue
        if what != "text" or data is None:
            parts.append(f"[file: {att.filename}]")
            skipped.append(att.filename)
            continue
        body = data.decode("utf-8", errors="replace").replace("\r\n", "\n").strip()
        if len(body) > left:
            body, cut = body[: max(left, 0)], True
        left -= len(body)
        parts.append(f"[file: {att.filename}]\n{body}".rstrip())
    if big_images:
        notes.append(IMAGES_TOO_BIG.format(names=", ".join(big_images[:3]),
                                           mb=MAX_IMAGE_BYTES // 1_000_000))  # fmt: skip
    if extra_images:
        notes.append(IMAGES_TOO_MANY.format(n=MAX_IMAGES, names=", ".join(extra_images[:3])))
    if odd_images:
        notes.append(IMAGES_UNKNOWN.format(names=", ".join(odd_images[:3])))
    if big_texts:
        notes.append(TEXT_TOO_BIG.format(names=", ".join(big_texts[:3]),
                                         mb=MAX_TEXT_BYTES // 1_000_000))  # fmt: skip
    if skipped:
        notes.append(FILES_NOT_READ.format(names=", ".join(skipped[:3])))
    if cut:
        notes.append(CUT)
    return "\n\n".join(parts), ("; ".join(notes) or None), tuple(images)


Upload = tuple[str, bytes]


def fit_uploads(files: list[Upload], *, limit: int) -> tuple[list[list[Upload]], str | None]:
    """``files`` grouped into upload messages that Discord accepts, and a note when a file had
    to be compressed or split."""
    room = max(limit - UPLOAD_HEADROOM, 1)
    ready: list[Upload] = []
    changed: list[str] = []
    for name, data in files:
        if len(data) <= room:
            ready.append((name, data))
            continue
        packed = gzip.compress(data, mtime=0)
        if len(packed) <= room:
            ready.append((f"{name}.gz", packed))
            changed.append(f"{name} was over the upload limit: sent gzip-compressed")
            continue
        count = -(-len(packed) // room)
        for i in range(count):
            piece = packed[i * room : (i + 1) * room]
            ready.append((f"{name}.gz.part{i + 1}of{count}", piece))
        changed.append(
            f"{name} was over the upload limit: sent compressed in {count} pieces "
            f"(join them with: cat {name}.gz.part* > {name}.gz)"
        )
    batches: list[list[Upload]] = []
    for upload in ready:
        last = batches[-1] if batches else None
        if (
            last is not None
            and len(last) < FILES_PER_MESSAGE
            and sum(len(d) for _, d in last) + len(upload[1]) <= room
        ):
            last.append(upload)
        else:
            batches.append([upload])
    return batches, ("; ".join(changed) or None)
