"""docs/ stays true to the code it documents."""
import os

from tarantella.common import config

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")


def test_environment_table_is_generated_from_the_parameter_table():
    with open(os.path.join(DOCS, "environment.md")) as f:
        assert config.markdown_table() in f.read()


def test_every_variable_read_outside_the_table_is_documented():
    # TNT_GPU_LISTING, TNT_STATE_DIR, ... are read, and unknown_names() keeps quiet
    # about them: environment.md must name them, as it names the table's
    with open(os.path.join(DOCS, "environment.md")) as f:
        text = f.read()
    missing = [name for name in config._UNLISTED if f"| `{name}` |" not in text]
    assert not missing, f"not in docs/environment.md: {missing}"


def test_core_reads_the_documented_defaults():
    # the C core has its own table (core/src/params.c): the defaults must agree
    with open(os.path.join(DOCS, "..", "core", "src", "params.c")) as f:
        source = f.read()
    for name in ("TNT_FUSION_THRESHOLD_KB", "TNT_TIMEOUT_S", "TNT_SHM_SLOT_KB", "TNT_SHM_SLOTS",
                 "TNT_CACHE_CAPACITY", "TNT_SPIN_US", "TNT_HIERARCHICAL", "TNT_BIT_ROUNDS", "TNT_SIMD",
                 "TNT_STREAM_MIN_KB", "TNT_SHM_DIRECT", "TNT_MPI_PAIR_SUM", "TNT_MPI_PAIR_PIECE_KB", "TNT_RIDES", "TNT_SHM_PLACEMENT",
                 "TNT_NET_SPIN_US"):
        default = config.BY_NAME[name].default
        assert f'{{"{name}", {default:g},' in source, name


def test_migration_guide_states_the_fusion_default():
    with open(os.path.join(DOCS, "migration.md")) as f:
        text = f.read()
    default = config.BY_NAME["TNT_FUSION_THRESHOLD_KB"].default
    assert f"default **{default:g}**" in text
