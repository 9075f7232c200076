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
    entry_points={
        # the command line (vta_ext/cli.py; also python -m vta_ext)
        "console_scripts": ["vta-ext = vta_ext.cli:main"],
        # tvm_csp_embed as a plugin of vta_ext (vta_ext/plugins.py): importing it registers the
        # CSP strategies; its tune module is the tuner of vta-ext tune / compile --records
        "vta_ext.strategies": ["csp = tvm_csp_embed"],
        "vta_ext.tuners": ["csp = tvm_csp_embed.tune"],
    },
    install_requires=[
        "apache-tvm==0.27.0.post1",
        "apache-tvm-ffi==0.1.14.post1",
        "numpy",
        "islpy",
        "minizinc",
        "xgboost-cpu",
        "tqdm",
        # tvm_csp_embed.tune: the Dask runner (measurement on a cluster); its test starts a
        # LocalCluster, so it is a plain dependency, not an extra
        "distributed",
        "matplotlib",
        # tvm.support.popen_pool (tune.LocalRunner's workers) needs them; apache-tvm does not
        # declare them
        "cloudpickle",
        "psutil",
    ],
    extras_require={
        # the frontend tests (ONNX float/QDQ, PT2E, the digits example) run in the default test
        # suite, so "test" brings what they import; scripts/setup_env.sh installs .[test,torch]
        "test": ["pytest", "pytest-xdist>=3.5", "hypothesis", "onnx>=1.17", "onnxruntime>=1.20", "onnxscript",
                 "scikit-learn"],
        # torchao 0.18 holds PyTorch's PT2E quantisation (prepare_pt2e / convert_pt2e) for torch 2.13
        "torch": ["torch==2.13.0", "torchao==0.18.*"],
        "onnx": ["onnx>=1.17", "onnxruntime>=1.20", "onnxscript"],
    },
)
