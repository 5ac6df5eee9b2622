"""The config's checks, made before any job: by the Snakefile at parse time and by the command
line (``fair_calib.cli``) on each stage's ``--settings``. The stages trust what passed them, and
import nothing from here.

``config``          loading, merging, the schema and the settings of each stage
``references``      the cross-references the schema cannot express (``fair-calib check-config``)
``plan``            what the grid plans (tasks per model, cells), shared with the census
``model_widths``    a model's widths, read without loading it
``method_shapes``   method sizes that must divide the widths (group sizes, Hadamard orders)
``label_text``      labels a table prints: one line, told apart, at most 40 characters
``method_defaults`` a method's resolved settings (a job's settings hold its defaults)
"""
