"""Exporters: a Plan as launch arguments or configuration of training frameworks, and as stage ONNX files.

* :mod:`planner.export.megatron` -- Megatron-LM command-line arguments
* :mod:`planner.export.deepspeed` -- a DeepSpeed ``ds_config`` dictionary
* :mod:`planner.export.torchtitan` -- a torchtitan configuration: a Python module whose function returns
  ``Trainer.Config``
* :mod:`planner.export.torchrec` -- a TorchRec-style embedding sharding plan
* :mod:`planner.export.stages` -- one ONNX model per pipeline stage (``planner split``)
"""
