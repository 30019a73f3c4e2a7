"""The training method (medusa/training/method.py): chosen once from recipe.method."""

from __future__ import annotations

from medusa.config import METHODS, Recipe
from medusa.training import medusa1, medusa2
from medusa.training.method import METHODS as TRAINING_METHODS
from medusa.training.method import method_of


def test_the_method_is_chosen_once_from_the_recipe():
    assert set(TRAINING_METHODS) == set(METHODS)
    assert method_of(Recipe(method="medusa1")) is medusa1.METHOD
    assert method_of(Recipe(method="medusa2")) is medusa2.METHOD
