"""The PromQL subset the embedded rule engine evaluates, checked at build time.

``check_supported(expr)`` refuses, with the construct and its position, anything the evaluator
cannot compute; :class:`Evaluator` computes the rest exactly as Prometheus 2.42 does.
"""

from alert_rules.promql.errors import EvaluationError, UnsupportedExpression
from alert_rules.promql.evaluate import Evaluator
from alert_rules.promql.parse import check_supported, parse_expr

__all__ = ["EvaluationError", "Evaluator", "UnsupportedExpression", "check_supported", "parse_expr"]
