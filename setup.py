"""Install script for vta_ext (VTA re-created in Python) and tvm_csp_embed (CSP-derived templates)."""
from setuptools import find_packages, setup

setup(
    name="tvm-csp-embed",
    version="0.1.0",
    description="A TVM 0.27 plugin for the VTA accelerator: vta_ext (config, ISA, runtime, "
    "simulator, stock templates) and tvm_csp_embed (constraint-based instruction embedding).",
    packages=find_packages(include=["vta_ext", "vta_ext.*", "tvm_csp_embed", "tvm_csp_embed.*"]),
    package_data={"vta_ext": ["configs/*.json"], "tvm_csp_embed": ["models/*.mzn"]},
    python_requires=">=3.10",
    install_requires=[
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy",
        "islpy",
        "minizinc",
        "xgboost-cpu",
        "tqdm",
        "matplotlib",
    ],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "torch": ["torch==2.13.0"],
        "onnx": ["onnx"],
    },
)
