"""benchmarks.head_types: the Hydra heads' recipe overrides follow the MEDUSA-1 recipe's projection.
(The head-type rows of a whole run: tests/integration/test_stories260k_pipeline.py.)"""


def test_hydra_overrides_follow_the_medusa1_projection(tmp_path):
    from benchmarks.head_types import HeadTypePlan, hydra_overrides

    def plan(recipe_text, overrides=()):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(recipe_text)
        return HeadTypePlan(recipe=str(recipe), overrides=("model=m", *overrides), user_overrides=("a.b=1",),
                            calib_data=tmp_path, medusa1_final=tmp_path, hydra_final=tmp_path, reports={})

    shared = "heads:\n  head_type: shared_lm_head\n"
    assert hydra_overrides(plan(shared)) == ["model=m", "heads.head_type=hydra",
                                             "heads.hydra_projection=shared_lm_head", "a.b=1"]
    linear = hydra_overrides(plan("heads:\n  head_type: linear\n"))
    assert linear == ["model=m", "heads.head_type=hydra", "a.b=1"]
    overridden = hydra_overrides(plan(shared, ["heads.head_type=linear"]))
    assert "heads.hydra_projection=shared_lm_head" not in overridden
