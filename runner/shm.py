"""The job's POSIX shared-memory objects: the core names them /dev/shm/tnt-<jobid>...,
so everything of a job is found by its (unguessable) job id, never by a process name."""
import glob
import os

SHM_DIR = "/dev/shm"


def entries(job_id, shm_dir=SHM_DIR):
    """Paths in /dev/shm that belong to job `job_id` (empty id: nothing, never everything)."""
    if not job_id:
        return []
    return sorted(glob.glob(os.path.join(glob.escape(shm_dir), glob.escape(f"tnt-{job_id}") + "*")))


def remove(job_id, shm_dir=SHM_DIR):
    """Remove the job's shared-memory objects; returns the paths removed."""
    removed = []
    for path in entries(job_id, shm_dir):
        try:
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:  # a rank unlinked it meanwhile: that is fine
            pass
        except OSError:
            pass  # not ours (another user): leave it, the caller reports what was removed
    return removed
