"""MkDocs hook (mkdocs.yml ``hooks:``): the benchmarks' own result pages join the site.

Every benchmark writes ``benchmarks/results/NAME.md`` (and a ``.png``) from its JSON; the site
serves them at ``benchmarks/results/`` so a page links to a result file and a broken link fails
``mkdocs build --strict`` like any other.
"""

from pathlib import Path

from mkdocs.structure.files import File, Files

RESULTS = Path(__file__).resolve().parent / "results"


def on_files(files: Files, config) -> Files:
    for path in sorted(RESULTS.iterdir()):
        if path.suffix in (".md", ".png") and path.is_file():
            files.append(File.generated(config, f"benchmarks/results/{path.name}",
                                        abs_src_path=str(path)))
    return files
