//! The sandbox a plan runs in: what a script may not do (files, programs, `eval`, imports from
//! elsewhere than the plan's own directory) and how far it may go (operations, call depth,
//! sizes), and compiling plan text with errors at `file:line:column`.

use std::path::{Path, PathBuf};

use rhai::{
    Dynamic, Engine, EvalAltResult, Module, ModuleResolver, ParseError, ParseErrorType, Position,
    Scope, AST,
};

use super::experiments::WITH_KNOBS;
use super::values::RResult;
use crate::limits::MAX_PLAN_BYTES;

/// Most configurations one `matrix()`, `sweep()` or `compare()` call may run (docs/PLANS.md):
/// a larger call is refused at its file:line:col before any configuration is built.
pub const MAX_CONFIGURATIONS: usize = 10_000;

/// Most experiments a whole plan may run (its dry pass keeps every one's name and result).
pub const MAX_PLAN_EXPERIMENTS: usize = 100_000;

/// Rhai's data-size limits, which count nested values: an array of [`MAX_CONFIGURATIONS`]
/// results (a few hundred map entries and array items each, after the real pass) must fit.
/// What a script builds itself is bounded by these and by the operation limit.
const MAX_MAP_ENTRIES: usize = 8_000_000;
const MAX_ARRAY_ITEMS: usize = 2_000_000;
/// Rhai counts every string nested in a value against this too: the names, labels and knob
/// texts of [`MAX_CONFIGURATIONS`] results take a few MiB.
const MAX_STRING_BYTES: usize = 16 << 20;

/// Engine limits: a plan that runs away is stopped with a message instead of hanging.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_operations: u64,
    pub max_call_levels: usize,
    pub max_expr_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_operations: 5_000_000,
            max_call_levels: 32,
            max_expr_depth: 64,
        }
    }
}

/// Most modules being imported at once (a module importing a module importing ...): a longer
/// chain is refused at its `import` rather than running the process out of stack.
pub const MAX_IMPORT_DEPTH: usize = 16;

/// Resolves `import "name"` to `name.rhai` beside the plan, and nothing else: no paths, no
/// other directories. A module that is being imported already (the plan itself, or a module
/// importing itself directly or through others) is an import cycle, refused at its `import`
/// with the chain; Rhai's own resolver would recurse until the stack overflows.
struct PlanDirResolver {
    dir: PathBuf,
    /// The plan's file, as errors name it.
    plan: String,
    /// The file names being imported, outermost first; the plan's own file is the first.
    importing: std::sync::Mutex<Vec<String>>,
}

/// Pops the module it was made for off the import chain when its import ends, however it ends.
struct Importing<'a>(&'a std::sync::Mutex<Vec<String>>);

impl Drop for Importing<'_> {
    fn drop(&mut self) {
        if let Ok(mut v) = self.0.lock() {
            v.pop();
        }
    }
}

impl ModuleResolver for PlanDirResolver {
    fn resolve(
        &self,
        engine: &Engine,
        source: Option<&str>,
        path: &str,
        pos: Position,
    ) -> RResult<rhai::Shared<Module>> {
        let bad = || {
            Box::new(EvalAltResult::ErrorRuntime(
                Dynamic::from(format!(
                    "cannot import `{path}`: plans may import only modules beside them, by plain name such as \"common\""
                )),
                pos,
            ))
        };
        if path.is_empty()
            || !path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(bad());
        }
        let name = format!("{path}.rhai");
        let file = self.dir.join(&name);
        let _importing = {
            let mut chain = self
                .importing
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let refuse =
                |why: String| Box::new(EvalAltResult::ErrorRuntime(Dynamic::from(why), pos));
            let at = match source {
                Some(s) => format!(
                    "{s}:{}:{}",
                    pos.line().unwrap_or(0),
                    pos.position().unwrap_or(0)
                ),
                None => format!(
                    "{}:{}:{}",
                    self.plan,
                    pos.line().unwrap_or(0),
                    pos.position().unwrap_or(0)
                ),
            };
            if chain.contains(&name) {
                return Err(refuse(format!(
                    "import cycle: `import \"{path}\"` at {at} imports a file that is being imported already ({} -> {name}); plans and modules may not import themselves, directly or through others",
                    chain.join(" -> ")
                )));
            }
            if chain.len() > MAX_IMPORT_DEPTH {
                return Err(refuse(format!(
                    "`import \"{path}\"` at {at} nests imports more than {MAX_IMPORT_DEPTH} deep ({} -> {name})",
                    chain.join(" -> ")
                )));
            }
            chain.push(name);
            Importing(&self.importing)
        };
        let text = tcpx_report::safe::read_bounded(&file, MAX_PLAN_BYTES, "a plan module")
            .map_err(|e| {
                if file.exists() {
                    Box::new(EvalAltResult::ErrorRuntime(
                        Dynamic::from(format!("cannot import `{path}`: {e:#}")),
                        pos,
                    ))
                } else {
                    bad()
                }
            })?;
        let mut ast = engine.compile(&text).map_err(|e| {
            Box::new(EvalAltResult::ErrorInModule(
                path.to_string(),
                Box::new(EvalAltResult::ErrorRuntime(
                    Dynamic::from(format!(
                        "{}:{}:{}: {}",
                        file.display(),
                        e.1.line().unwrap_or(0),
                        e.1.position().unwrap_or(0),
                        syntax_message(&e)
                    )),
                    e.1,
                )),
                pos,
            ))
        })?;
        ast.set_source(file.display().to_string());
        // An error inside the module is wrapped at this `import`, so that it is reported at
        // the importing file's line (and the module's own message names where in the module).
        let m = Module::eval_ast_as_new(Scope::new(), &ast, engine)
            .map_err(|e| Box::new(EvalAltResult::ErrorInModule(path.to_string(), e, pos)))?;
        Ok(rhai::Shared::new(m))
    }
}

/// A fresh engine with the sandbox's limits, no `eval`, and imports only from the directory of
/// `plan` (the plan's file), without cycles. Rhai
/// itself has no file or process functions; nothing here adds any.
pub(super) fn engine(plan: &Path, limits: Limits) -> Engine {
    let dir = plan
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut engine = Engine::new();
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(limits.max_call_levels);
    engine.set_max_expr_depths(limits.max_expr_depth, limits.max_expr_depth);
    engine.set_max_string_size(MAX_STRING_BYTES);
    engine.set_max_array_size(MAX_ARRAY_ITEMS);
    engine.set_max_map_size(MAX_MAP_ENTRIES);
    engine.set_max_modules(16);
    engine.disable_symbol("eval");
    let own = plan
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    engine.set_module_resolver(PlanDirResolver {
        dir: dir.to_path_buf(),
        plan: plan.display().to_string(),
        importing: std::sync::Mutex::new(vec![own]),
    });
    engine
}

/// The message of a syntax error. `exp.with(...)`, the old name of `exp.with_knobs(...)`, is a
/// reserved word in Rhai: the error says which name to use instead.
fn syntax_message(e: &ParseError) -> String {
    match e.err_type() {
        ParseErrorType::Reserved(word) if word == "with" => format!(
            "`with` is a reserved word in Rhai: derive an experiment with `exp.{WITH_KNOBS}(#{{ ... }})`"
        ),
        other => other.to_string(),
    }
}

/// Compiles plan text; a syntax error as `file:line:column: syntax error: message`.
pub(super) fn compile(engine: &Engine, file: &str, source: &str) -> Result<AST, String> {
    engine.compile(source).map_err(|e| {
        format!(
            "{file}:{}:{}: syntax error: {}",
            e.1.line().unwrap_or(0),
            e.1.position().unwrap_or(0),
            syntax_message(&e)
        )
    })
}
