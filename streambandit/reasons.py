"""Reason codes of dead-letter records: one place, so the worker, the metrics and the docs agree.

Each code names what was wrong with the refused record; docs/schemas.md lists them with examples.
"""

# Bytes that are not a record of ours.
MALFORMED = "malformed"  # too short, bad magic byte, or an Avro body that does not decode
UNKNOWN_SCHEMA = "unknown_schema"  # a schema id or version this reader does not know
MISSING_FIELD = "missing_field"  # the writer schema lacks a field the reader needs, with no default
WRONG_TOPIC = "wrong_topic"  # a valid record of a type that does not belong on this topic
# Records that decode but cannot be used.
EMPTY_ARMS = "empty_arms"
# two candidate arms of one context with the same id (the action could not say which)
DUPLICATE_ARM_ID = "duplicate_arm_id"
BAD_DIMENSION = "bad_dimension"  # arms of differing dimension, or not the model's dimension
NON_FINITE_FEATURES = "non_finite_features"
FEATURE_OUT_OF_RANGE = (
    "feature_out_of_range"  # a feature beyond the learners' bound (kernels.MAX_ABS_FEATURE)
)
NON_FINITE_REWARD = "non_finite_reward"
UNKNOWN_MODEL = "unknown_model"  # no configuration matches the model key
DUPLICATE_EVENT = "duplicate_event"  # a context whose event id was already decided
DUPLICATE_REWARD = "duplicate_reward"  # a reward for an event already joined with a reward
LATE_REWARD = "late_reward"  # a reward after its decision's window closed (default reward applied)
UNKNOWN_EVENT = "unknown_event"  # a reward whose context did not arrive within the window
REWARD_OUT_OF_RANGE = (
    "reward_out_of_range"  # e.g. negative for Poisson, outside [0, 1] for logistic
)
MODEL_KEY_MISMATCH = "model_key_mismatch"  # a reward whose model key differs from its decision's
UPDATE_FAILED = "update_failed"  # the learner refused the update (its detail says why)
KEY_MISMATCH = (
    "key_mismatch"  # the message key differs from the record's model key (wrong partition)
)
ID_TOO_LONG = (
    "id_too_long"  # an event id, model key or chosen arm id longer than max_id_bytes (UTF-8)
)
FOREIGN_TICK = "foreign_tick"  # a watermark tick on rewards not written by a worker of this group
EVENT_TIME_AHEAD = (
    "event_time_ahead"  # event time beyond the record's Kafka timestamp + max_event_time_ahead_ms
)
TOO_MANY_MODELS = (
    "too_many_models"  # a context of a new model key when max_models models exist already
)
BAD_DECISION = "bad_decision"  # a logged decision whose chosen arm index, propensity or model version is impossible

ALL = tuple(v for k, v in dict(globals()).items() if k.isupper())
