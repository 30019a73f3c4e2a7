"""The enumerations (medusa/config/enums.py), defined once: the places that list them use these tuples."""

from medusa.config import enums


def test_head_types_and_projections():
    assert enums.HEAD_TYPES == ("linear", "shared_lm_head", "hydra", "eagle3")
    assert set(enums.MEDUSA_HEAD_TYPES) <= set(enums.HEAD_TYPES)
    assert "hydra" not in enums.EXPORTABLE_HEAD_TYPES
    assert enums.HYDRA_PROJECTIONS == ("own", "shared_lm_head")


def test_every_enumeration_is_a_tuple_of_distinct_strings():
    names = [n for n in dir(enums) if n.isupper()]
    expected = {"METHODS", "FORMATS", "ACCEPTANCE", "EXPORT_FORMATS", "SCHEDULERS", "LAMBDA0_SCHEDULES"}
    assert expected <= set(names)
    for name in names:
        value = getattr(enums, name)
        assert isinstance(value, tuple) and all(isinstance(v, str) for v in value), name
        assert len(set(value)) == len(value), name


def test_the_listing_places_use_them():
    import medusa.cli.heads
    import medusa.export
    import medusa.modeling.heads
    import medusa.selfdistill.prompts

    assert medusa.modeling.heads.MEDUSA_HEAD_TYPES is enums.MEDUSA_HEAD_TYPES
    assert medusa.export.EXPORT_FORMATS is enums.EXPORT_FORMATS
    assert medusa.selfdistill.prompts.FORMATS is enums.PROMPT_FORMATS
    assert medusa.cli.heads.HEAD_TYPES is enums.HEAD_TYPES
    assert set(enums.CHAT_FORMATS) < set(enums.PROMPT_FORMATS)
    assert enums.ACCEPTANCE == ("greedy", "sample", "typical")
