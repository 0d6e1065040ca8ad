"""Replay and off-policy evaluation: logged decisions, their file formats, the estimators."""

from streambandit.replay.estimators import Estimate, OffPolicyEvaluator, RidgeRewardModel
from streambandit.replay.files import read_avro, read_catalog, read_csv, write_avro
from streambandit.replay.logged import LogError, LoggedDecision, validate

__all__ = [
    "LoggedDecision",
    "LogError",
    "validate",
    "Estimate",
    "OffPolicyEvaluator",
    "RidgeRewardModel",
    "read_csv",
    "read_catalog",
    "read_avro",
    "write_avro",
]
