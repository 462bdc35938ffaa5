"""zlayout: plan, verify and export DeepSpeed ZeRO memory layouts."""

__version__ = "0.1.0"
