//! `bourse engine run`: commands in, events out, both as JSON Lines.
//!
//! A line that is not a valid command stops the run with its line number and the reason:
//! replaying a trading day must not silently skip a command.

use anyhow::{anyhow, bail, Context, Result};
use bourse_core::{Command, Event};
use bourse_engine::capacity::Preallocation;
use bourse_engine::{Engine, EngineConfig};
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::path::Path;

/// The longest command line accepted, in bytes.
const LINE_BYTES_MAX: usize = 64 * 1024;

pub fn run(input: &Path, output: &Path, summary: bool, orders_max: u32) -> Result<()> {
    let config = EngineConfig {
        orders_max,
        ..EngineConfig::default()
    };
    config
        .check()
        .map_err(|why| anyhow!("--orders-max: {why}"))?;
    check_engines_fit(&config, 1)?;
    let reader: Box<dyn BufRead> = if input == Path::new("-") {
        Box::new(BufReader::new(io::stdin()))
    } else {
        Box::new(BufReader::new(
            File::open(input).with_context(|| format!("cannot open {}", input.display()))?,
        ))
    };
    let writer: Box<dyn Write> = if output == Path::new("-") {
        Box::new(BufWriter::new(io::stdout()))
    } else {
        Box::new(BufWriter::new(File::create(output).with_context(|| {
            format!("cannot create {}", output.display())
        })?))
    };
    let engine = Engine::new(config);
    let (engine, lines) = process(engine, reader, writer)?;
    if summary {
        let c = engine.counters();
        eprintln!(
            "commands {} accepted {} rejected {} trades {} live_orders {} state_hash {:016x} (from {lines} lines)",
            c.commands,
            c.orders_accepted,
            c.orders_rejected,
            c.trades,
            engine.live_orders(),
            engine.state_hash()
        );
    }
    Ok(())
}

/// Refuses to start `cores` engines with `config` when the memory they set aside exceeds
/// what this machine can give: the allocator would abort the process instead of failing.
/// `orders_max` is the one limit set on the command line, so the refusal names its flag.
pub fn check_engines_fit(config: &EngineConfig, cores: u64) -> Result<()> {
    let preallocations = engine_preallocations(config, cores);
    bourse_cluster::machine::check_fits_machine(&preallocations).map_err(|why| anyhow!(why))
}

/// The memory `cores` engines with `config` set aside, `orders_max` named by its flag.
fn engine_preallocations(config: &EngineConfig, cores: u64) -> Vec<Preallocation> {
    config
        .preallocations()
        .into_iter()
        .map(|p| match p.setting.as_str() {
            "orders_max" => p.as_flag(),
            _ => p,
        })
        .map(|p| p.times(cores))
        .collect()
}

/// Applies every command line of `reader` to `engine` and writes the events to `writer`.
/// Blank lines and lines starting with `#` are skipped. Returns the engine and the number of
/// lines read.
pub fn process(
    mut engine: Engine,
    reader: impl BufRead,
    mut writer: impl Write,
) -> Result<(Engine, u64)> {
    let mut events: Vec<Event> = Vec::with_capacity(256);
    let mut line_no = 0u64;
    for line in reader.lines() {
        line_no += 1;
        let line = line.with_context(|| format!("line {line_no}: cannot read"))?;
        let text = line.trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        if text.len() > LINE_BYTES_MAX {
            bail!("line {line_no}: longer than {LINE_BYTES_MAX} bytes");
        }
        let cmd: Command = serde_json::from_str(text)
            .with_context(|| format!("line {line_no}: not a valid command"))?;
        events.clear();
        engine.apply(&cmd, &mut events);
        for e in &events {
            serde_json::to_writer(&mut writer, e)?;
            writer.write_all(b"\n")?;
        }
    }
    writer.flush()?;
    Ok((engine, line_no))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_trading_day_runs_from_json_lines() {
        let input = r#"
# one equity, two accounts, one trade
{"ts_ns":1,"cmd":"add_instrument","instrument":1,"symbol":"SBER","market":"equity","price_scale":2,"tick":1,"lot_size":10,"band_bps":2000,"reference_price":30000}
{"ts_ns":2,"cmd":"add_account","account":1,"firm":1,"may_short":true}
{"ts_ns":3,"cmd":"add_account","account":2,"firm":2}
{"ts_ns":4,"cmd":"deposit","account":1,"amount":1000000000}
{"ts_ns":5,"cmd":"deposit","account":2,"amount":1000000000}
{"ts_ns":6,"cmd":"new_order","account":1,"cl_ord_id":1,"instrument":1,"side":"sell","price":30000,"qty":5}
{"ts_ns":7,"cmd":"new_order","account":2,"cl_ord_id":1,"instrument":1,"side":"buy","price":30010,"qty":3,"tif":"ioc"}
{"ts_ns":8,"cmd":"cancel","account":1,"orig_cl_ord_id":1}
"#;
        let mut out = Vec::new();
        let (engine, _) = process(
            Engine::new(EngineConfig::default()),
            input.as_bytes(),
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(r#""event":"trade""#), "{text}");
        assert!(text.contains(r#""event":"order_cancelled""#), "{text}");
        assert_eq!(engine.counters().trades, 1);
        assert_eq!(engine.live_orders(), 0);
        for line in text.lines() {
            let _: Event = serde_json::from_str(line).unwrap();
        }
    }

    #[test]
    fn the_example_trading_day_runs() {
        let input = include_str!("../../../examples/trading-day.jsonl");
        let mut out = Vec::new();
        let (engine, _) = process(
            Engine::new(EngineConfig::default()),
            input.as_bytes(),
            &mut out,
        )
        .expect("examples/trading-day.jsonl is valid");
        assert!(engine.counters().trades > 0);
    }

    #[test]
    fn a_bad_line_stops_the_run_with_its_number() {
        let input = "{\"ts_ns\":1,\"cmd\":\"end_of_day\"}\n{\"ts_ns\":2,\"cmd\":\"fly\"}\n";
        let err = process(
            Engine::new(EngineConfig::default()),
            input.as_bytes(),
            Vec::new(),
        )
        .err()
        .unwrap();
        assert!(format!("{err:#}").contains("line 2"), "{err:#}");
    }

    #[test]
    fn an_unknown_field_stops_the_run_naming_the_line_and_the_field() {
        let input = concat!(
            "{\"ts_ns\":1,\"cmd\":\"end_of_day\"}\n",
            "{\"ts_ns\":2,\"cmd\":\"new_order\",\"account\":1,\"cl_ord_id\":1,\"instrument\":1,",
            "\"side\":\"buy\",\"price\":100,\"qty\":10,\"display_qtty\":1}\n",
        );
        let err = process(
            Engine::new(EngineConfig::default()),
            input.as_bytes(),
            Vec::new(),
        )
        .err()
        .expect("a misspelled field is refused");
        let text = format!("{err:#}");
        assert!(text.contains("line 2"), "{text}");
        assert!(text.contains("unknown field `display_qtty`"), "{text}");
    }

    #[test]
    fn the_refusal_names_the_orders_max_flag_and_counts_the_cores() {
        let config = EngineConfig {
            orders_max: 4_294_967_294,
            ..EngineConfig::default()
        };
        let preallocations = engine_preallocations(&config, 3);
        let text = bourse_engine::capacity::check_fits(&preallocations, 23 << 30).unwrap_err();
        assert!(text.starts_with("--orders-max 4294967294 needs "), "{text}");
        assert!(text.contains("(3 copies)"), "{text}");
        let one = bourse_engine::capacity::check_fits(&engine_preallocations(&config, 1), 23 << 30)
            .unwrap_err();
        assert!(!one.contains("copies"), "{one}");
    }

    #[test]
    fn a_limit_out_of_range_is_a_clear_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.jsonl");
        std::fs::write(&input, "").unwrap();
        for orders_max in [0, u32::MAX] {
            let err =
                run(&input, &dir.path().join("out.jsonl"), false, orders_max).expect_err("refused");
            let text = format!("{err:#}");
            assert!(text.contains("--orders-max"), "{text}");
            assert!(text.contains("out of range"), "{text}");
        }
    }
}
