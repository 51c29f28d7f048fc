"""Node image versions users pick by id (``image_version_id``); admins register them.

The default Slurm node image is registered at start-up (bootstrap).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuyard.core.errors import GpuyardError, NotFound, ValidationFailed
from gpuyard.core.image_refs import DEFAULT_ALLOWED_REGISTRIES, RegistryPolicy, check_image
from gpuyard.runtimes.slurm.image import SLURM_IMAGE
from gpuyard.services.access.resource_util import in_id_range, iso, one_id
from gpuyard.services.context import Context
from gpuyard.services.tenancy.auth import Principal, Scope
from gpuyard.store.schema import ImageVersion

# The default image is the one runtimes/slurm/image.py builds (SLURM_IMAGE).
SLURM_IMAGE_NAME = "slurm-node"
SLURM_IMAGE_VERSION = "22.05-bookworm"
SLURM_IMAGE_DESCRIPTION = "Slurm 22.05 on Debian bookworm: slurmctld, slurmd, munge and sshd"

# The allow-list used when the caller passes none: the default setting's.
DEFAULT_POLICY = RegistryPolicy.parse(DEFAULT_ALLOWED_REGISTRIES)
# The built-in node image is built on the host (localhost/...), whatever the setting.
_LOCAL_ONLY = RegistryPolicy.parse("localhost")


class ImageNotFound(NotFound):
    code = "IMAGE_NOT_FOUND"


class ImageExists(GpuyardError):
    """An image reference is registered once; its id is in ``details``."""

    code = "IMAGE_EXISTS"
    http_status = 409


def _text(field: str, value: object, limit: int, *, required: bool = True) -> str:
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ValidationFailed(field, "must be a string")
    value = value.strip()
    if (required and not value) or len(value) > limit:
        raise ValidationFailed(field, f"must be {1 if required else 0} to {limit} characters")
    return value


def register_image(
    session: Session,
    name: object,
    version: object,
    image: object,
    description: object = None,
    *,
    registries: RegistryPolicy = DEFAULT_POLICY,
) -> ImageVersion:
    """Register an image version whose registry ``registries`` allows (the operator's
    GPUYARD_ALLOWED_REGISTRIES at the API), inside the caller's transaction. Raises
    ValidationFailed naming the field, or ImageExists (409) when ``image`` is already
    registered."""
    clean_name = _text("name", name, 200)
    clean_version = _text("version", version, 100)
    clean_image = _text("image", image, 512)
    check_image(clean_image, registries, "image")
    clean_description = _text("description", description, 10_000, required=False)
    _refuse_existing(session, clean_image)
    row = ImageVersion(
        name=clean_name,
        version=clean_version,
        image=clean_image,
        description=clean_description,
    )
    try:
        # A savepoint: a concurrent registration of the same reference (unique key)
        # must end as ImageExists, not abort the caller's transaction.
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        _refuse_existing(session, clean_image)
        raise
    return row


def _refuse_existing(session: Session, image: str) -> None:
    existing = session.scalar(select(ImageVersion).where(ImageVersion.image == image))
    if existing is not None:
        raise ImageExists(
            f"image {image!r} is already registered as image version {existing.id}",
            {"field": "image", "image_version_id": existing.id},
        )


def ensure_default_image(session: Session) -> ImageVersion:
    """The Slurm node image's row, registered on the first start (idempotent: an
    existing row, possibly edited by an admin, is kept as it is)."""
    try:
        return register_image(
            session,
            SLURM_IMAGE_NAME,
            SLURM_IMAGE_VERSION,
            SLURM_IMAGE,
            SLURM_IMAGE_DESCRIPTION,
            registries=_LOCAL_ONLY,
        )
    except ImageExists:
        row = session.scalar(select(ImageVersion).where(ImageVersion.image == SLURM_IMAGE))
        if row is None:
            raise
        return row


def list_images(ctx: Context) -> list[ImageVersion]:
    """Every registered image version, oldest first (anybody with a key)."""
    with ctx.read() as session:
        return list(session.scalars(select(ImageVersion).order_by(ImageVersion.id)))


def show_image(ctx: Context, image_version_id: int) -> ImageVersion:
    """One image version by id (a path parameter). Raises ImageNotFound."""
    with ctx.read() as session:
        row = session.get(ImageVersion, image_version_id) if in_id_range(image_version_id) else None
        if row is None:
            raise ImageNotFound(
                f"image version {image_version_id} not found",
                {"image_version_id": image_version_id},
            )
        return row


def add_image_version(
    ctx: Context,
    principal: Principal,
    name: object,
    version: object,
    image: object,
    description: object = None,
) -> ImageVersion:
    """Register an image version from a registry the operator's
    GPUYARD_ALLOWED_REGISTRIES allows. Needs the admin scope (the operator). Raises
    Forbidden, ValidationFailed naming the field, or ImageExists (409)."""
    principal.require(Scope.ADMIN)
    with ctx.transaction() as session:
        return register_image(
            session,
            name,
            version,
            image,
            description,
            registries=ctx.settings.registry_policy,
        )


def get_image_version(
    session: Session, image_version_id: object, field: str = "image_version_id"
) -> ImageVersion:
    """The image version a request body names. Raises ValidationFailed(field, ...) for
    a missing, non-integer or unknown id."""
    if image_version_id is None:
        raise ValidationFailed(field, "is required")
    wanted = one_id(image_version_id, field, "image version")
    row = session.get(ImageVersion, wanted) if in_id_range(wanted) else None
    if row is None:
        raise ValidationFailed(
            field, f"image version {wanted} not found", {"image_version_id": wanted}
        )
    return row


def image_view(row: ImageVersion) -> dict[str, object]:
    """The API shape of an image version."""
    return {
        "id": row.id,
        "name": row.name,
        "version": row.version,
        "image": row.image,
        "description": row.description,
        "created_at": iso(row.created_at),
    }
