"""What makes a study's times comparable with a search's: the backend that measured them, the
device, the kernel template's identity and the timing mode. A study records them as user
attributes; a search that would measure otherwise refuses the study in one line
(:class:`~tuner.errors.StudyMismatchError`) instead of counting its trials as measured.

The backend is also part of the study's name (``study_name(..., backend=...)``): a simulated
search and a GPU search of one key never even open the same study, so trying the tool on the
simulated backend and then tuning on the GPU (with the default storage, one file for both)
just works. The other fields are refused rather than keyed: a study measured on another
device, by an older template or in another timing mode is not silently abandoned, and the
message says how to start another (``--study PREFIX`` or ``--storage``), or, for the timing
mode, how to resume it.

A study also belongs to the schedule database its winners go to (``database``: the identity
stored in that database, ``db.database_identity``; user attribute ``database_identity``). A study
of another database is not refused but left alone: a search filling a new database (another
``--db``, or the same path after the file was deleted) measures afresh in a study of its own,
named with its database (:func:`database_study`), instead of taking the other database's
conclusion for its own and storing nothing. The plain name stays with the first database that
records itself in it (and so with the studies made before databases were recorded, and those
``--compile-only`` makes without one).

Studies made before the attributes existed record none of them. Their timing mode is stream
launches with a cold L2 (the only mode there was, ``_trials.study_timing``); their backend is
read from their measured trials: every GPU search has recorded the local GPU that measured a
trial (user attribute ``device``) since 7af566d, a simulated one never did, so a study whose
measured trials name no GPU was measured by the simulated backend. Their device and template
are unknown: a search adopts such a study as its own (and records its identity from then on).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import StudyMismatchError
from ..measure import STATUSES, TimingMode
from ._trials import TIMING_ATTR, study_timing

__all__ = ["StudyIdentity", "BACKEND_ATTR", "DEVICE_ATTR", "TEMPLATE_ATTR", "DATABASE_ATTR",
           "database_study"]

#: the study's user attributes holding the backend, the device name and the template identity
#: (the timing mode's is ``_trials.TIMING_ATTR``)
BACKEND_ATTR = "backend"
DEVICE_ATTR = "device_name"
TEMPLATE_ATTR = "template_identity"
#: the study's user attribute holding the identity of the schedule database it fills
DATABASE_ATTR = "database_identity"


@dataclass(frozen=True, kw_only=True)
class StudyIdentity:
    """How a search measures, and the database it fills; ``None``: not known to it
    (``--compile-only`` knows the template only), neither checked nor recorded. ``database``
    is recorded, never checked: the study of another database is another name
    (:func:`database_study`)."""

    backend: str | None = None
    device_name: str | None = None
    template: str | None = None
    timing: TimingMode | None = None
    database: str | None = None

    def check(self, study) -> None:
        """Raise :class:`StudyMismatchError` (one line: what differs, the way out) when
        ``study`` was measured otherwise than this identity says."""
        found = recorded(study, backend=self.backend is not None)
        differ = []
        if self.timing is not None and found.timing not in (None, self.timing):
            differ.append(f"with {found.timing.describe()}, this search times "
                          f"{self.timing.describe()}")
        if self.backend is not None and found.backend not in (None, self.backend):
            differ.append(f"by the {found.backend} backend, this search by the "
                          f"{self.backend} backend")
        if self.device_name is not None and found.device_name not in (None, self.device_name):
            differ.append(f"on {found.device_name!r}, this search on {self.device_name!r}")
        if self.template is not None and found.template not in (None, self.template):
            differ.append(f"by kernel template {found.template}, this search's is "
                          f"{self.template} (the kernel has changed since)")
        if not differ:
            return
        only_timing = len(differ) == 1 and found.timing not in (None, self.timing)
        fix = ("give the study's timing flags to resume it, or another --study prefix to start "
               "one" if only_timing else
               "give another --study prefix, or another --storage, to start one")
        raise StudyMismatchError(f"study {study.study_name!r} was measured "
                                 f"{'; '.join(differ)}: its times cannot be mixed; {fix}")

    def record(self, study) -> None:
        """Record the known fields in ``study``'s user attributes (after :meth:`check`); the
        database only in a study that records none (the first database to fill a study keeps
        it)."""
        for attr, value in ((BACKEND_ATTR, self.backend), (DEVICE_ATTR, self.device_name),
                            (TEMPLATE_ATTR, self.template)):
            if value is not None and study.user_attrs.get(attr) != value:
                study.set_user_attr(attr, value)
        if self.database is not None and study.user_attrs.get(DATABASE_ATTR) is None:
            study.set_user_attr(DATABASE_ATTR, self.database)
        if self.timing is not None and study.user_attrs.get(TIMING_ATTR) != self.timing.to_dict():
            study.set_user_attr(TIMING_ATTR, self.timing.to_dict())


def database_study(storage, plain: str, own: str, database: str | None) -> str:
    """The study a search filling the schedule database ``database`` uses for a key: ``plain``
    (the key's name without a database) when that study does not exist yet, records no
    database or records ``database``; else ``own`` (the key's name with ``database``): the
    plain study belongs to another database. ``database`` ``None`` (a search that stores
    nothing): ``plain``."""
    if database is None:
        return plain
    try:
        study_id = storage.get_study_id_from_name(plain)
    except KeyError:  # no such study yet
        return plain
    owner = storage.get_study_user_attrs(study_id).get(DATABASE_ATTR)
    return plain if owner in (None, database) else own


def recorded(study, *, backend: bool = True) -> StudyIdentity:
    """The identity ``study`` records; for a study from before the attributes, the timing mode
    and backend its trials show (``backend``: read the trials for it), the rest ``None``."""
    attrs = study.user_attrs
    return StudyIdentity(
        backend=attrs.get(BACKEND_ATTR) or (_backend_of_trials(study) if backend else None),
        device_name=attrs.get(DEVICE_ATTR), template=attrs.get(TEMPLATE_ATTR),
        timing=study_timing(study), database=attrs.get(DATABASE_ATTR))


def _backend_of_trials(study) -> str | None:
    """The backend that measured a study from before :data:`BACKEND_ATTR`: ``"gpu"`` when a
    measured trial names the local GPU that measured it, ``"simulated"`` when measured trials
    name none, ``None`` when nothing was measured."""
    measured = [t for t in study.get_trials(deepcopy=False) if t.state.is_finished()
                and t.user_attrs.get("ticket") and t.user_attrs.get("status") in STATUSES]
    if not measured:
        return None
    return "gpu" if any("device" in t.user_attrs for t in measured) else "simulated"
