"""runtime.command_env: what of the runtime's view the image's programs (batch command, tasks) get: its bin/, last."""
from __future__ import annotations

import os

from minicluster.runtime import RUNTIME_ROOT, command_env

VIEW = RUNTIME_ROOT


def test_in_the_view_its_bin_comes_last_on_the_images_path() -> None:
    env = command_env({"PATH": "/usr/local/bin:/usr/bin", "HOME": "/home/app"}, view=True)
    assert env == {"PATH": f"/usr/local/bin:/usr/bin:{VIEW}/bin", "HOME": "/home/app"}


def test_an_image_without_path_gets_the_default_search_path_then_the_views_bin() -> None:
    assert command_env({}, view=True) == {"PATH": f"{os.defpath}:{VIEW}/bin"}


def test_nothing_else_of_the_view_reaches_the_images_programs() -> None:
    env = command_env({"PATH": f"{VIEW}/bin:/usr/bin", "LD_LIBRARY_PATH": f"{VIEW}/lib", "PYTHONHOME": f"{VIEW}/python",
                       "PYTHONPATH": f"/opt/py:{VIEW}/python/lib", "PMIX_PKGLIBDIR": f"{VIEW}/lib/pmix/lib/pmix",
                       "PMIX_PKGDATADIR": f"{VIEW}/lib/pmix/share/pmix", "APP_DATA": "/data"}, view=True)
    assert env == {"PATH": f"/usr/bin:{VIEW}/bin", "PYTHONPATH": "/opt/py", "APP_DATA": "/data"}


def test_the_images_own_settings_of_the_same_names_are_its_own() -> None:
    mine = {"PATH": "/usr/bin", "LD_LIBRARY_PATH": "/opt/lib", "PYTHONHOME": "/opt/python",
            "PMIX_PKGLIBDIR": "/opt/pmix/lib/pmix", "PATHX": f"{VIEW}/bin"}
    assert command_env(mine, view=False) == mine
