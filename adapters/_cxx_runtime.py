"""Initialise the system C++ runtime's locale before usearch loads (a process-wide ABI clash, not a style choice).

usearch's compiled module links libstdc++ statically and exports the standard locale-facet ids as
GNU-unique symbols, which bind process-wide whatever RTLD_LOCAL says. When usearch is imported
before the shared libstdc++ has set up its classic locale, the two runtimes number the facets with
separate counters; every C++ library loaded later (LightGBM, torch) then writes integers into streams
as empty text: LightGBM names every feature "Column_" and refuses to train, torch's error messages
lose their numbers. Building the shared runtime's classic locale first makes usearch reuse its ids.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger("amfs_server.adapters")
_done = False


def initialise_system_cxx_locale() -> None:
    global _done
    if _done:
        return
    _done = True
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        classic = ctypes.CDLL(name)._ZNSt6locale7classicEv  # std::locale::classic()
    except (OSError, AttributeError):  # no shared libstdc++ (macOS libc++, Windows): nothing clashes
        return
    classic.restype = ctypes.c_void_p
    classic()
