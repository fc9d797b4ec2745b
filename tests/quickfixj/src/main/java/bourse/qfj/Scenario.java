package bourse.qfj;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.function.Predicate;

import quickfix.Application;
import quickfix.DefaultMessageFactory;
import quickfix.FieldNotFound;
import quickfix.FileStoreFactory;
import quickfix.Message;
import quickfix.SLF4JLogFactory;
import quickfix.Session;
import quickfix.SessionID;
import quickfix.SessionSettings;
import quickfix.SocketInitiator;
import quickfix.field.ClOrdID;
import quickfix.field.MassCancelRequestType;
import quickfix.field.MsgType;
import quickfix.field.OrdType;
import quickfix.field.OrderQty;
import quickfix.field.OrigClOrdID;
import quickfix.field.Price;
import quickfix.field.Side;
import quickfix.field.Symbol;
import quickfix.field.TestReqID;
import quickfix.field.TimeInForce;
import quickfix.field.TransactTime;
import quickfix.fix44.NewOrderSingle;
import quickfix.fix44.OrderCancelReplaceRequest;
import quickfix.fix44.OrderCancelRequest;
import quickfix.fix44.OrderMassCancelRequest;
import quickfix.fix44.OrderStatusRequest;
import quickfix.fix44.TestRequest;

/**
 * QuickFIX/J initiators QA and QB against `bourse gateway`: logon, a trade between them,
 * replace, cancel, mass cancel, an insufficient-collateral reject, a forced sequence gap,
 * HeartBtInt=1 with a TestRequest, and logout / restart from the persistent store with no
 * execution report missing or duplicated. Prints "ALL OK" and exits 0 on success.
 *
 * Usage: Scenario HOST PORT STORE_DIR [TRUSTSTORE PASSWORD]: with a PKCS#12 trust store (its
 * password "changeit"), the sessions connect over TLS and send PASSWORD in Logon's Password (554).
 */
public final class Scenario {
    static final long WAIT_MS = 10_000;
    /** Over TLS with this trust store, when set. */
    static String trustStore;
    /** Sent as Password (554) on every Logon, when set. */
    static String logonPassword;

    /** Everything one session received, in order; consumed messages are marked. */
    static final class Peer implements Application {
        final List<Message> app = new ArrayList<>();
        final List<Message> admin = new ArrayList<>();
        final Set<Integer> consumed = new HashSet<>();
        volatile boolean loggedOn;

        public void onCreate(SessionID id) {}
        public void onLogon(SessionID id) { loggedOn = true; }
        public void onLogout(SessionID id) { loggedOn = false; }
        public void toAdmin(Message m, SessionID id) {
            if (logonPassword != null && type(m).equals("A")) {
                m.setString(554, logonPassword);
            }
        }
        public void toApp(Message m, SessionID id) {}
        public synchronized void fromAdmin(Message m, SessionID id) { admin.add(m); notifyAll(); }
        public synchronized void fromApp(Message m, SessionID id) { app.add(m); notifyAll(); }

        synchronized Message await(String what, Predicate<Message> p) throws InterruptedException {
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (true) {
                for (int i = 0; i < app.size(); i++) {
                    if (!consumed.contains(i) && p.test(app.get(i))) {
                        consumed.add(i);
                        return app.get(i);
                    }
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) {
                    throw new IllegalStateException("timed out waiting for " + what + "; received " + app);
                }
                wait(left);
            }
        }

        synchronized boolean awaitAdmin(Predicate<Message> p, long ms) throws InterruptedException {
            long deadline = System.currentTimeMillis() + ms;
            while (true) {
                for (Message m : admin) {
                    if (p.test(m)) return true;
                }
                long left = deadline - System.currentTimeMillis();
                if (left <= 0) return false;
                wait(left);
            }
        }

        synchronized List<String> execIds() {
            List<String> ids = new ArrayList<>();
            for (Message m : app) {
                if (type(m).equals("8")) ids.add(str(m, 17));
            }
            return ids;
        }
    }

    static String type(Message m) {
        try {
            return m.getHeader().getString(MsgType.FIELD);
        } catch (FieldNotFound e) {
            return "";
        }
    }

    static String str(Message m, int tag) {
        try {
            return m.getString(tag);
        } catch (FieldNotFound e) {
            return "";
        }
    }

    static Predicate<Message> exec(String clOrdId, String execType) {
        return m -> type(m).equals("8") && str(m, 11).equals(clOrdId) && str(m, 150).equals(execType);
    }

    static void check(boolean ok, String what) {
        if (!ok) throw new IllegalStateException("check failed: " + what);
        System.out.println("ok: " + what);
    }

    static SocketInitiator start(Peer peer, String comp, String host, int port, String store, int hb) throws Exception {
        SessionSettings s = new SessionSettings();
        SessionID id = new SessionID("FIX.4.4", comp, "BOURSE");
        s.setString(id, "ConnectionType", "initiator");
        s.setString(id, "SocketConnectHost", host);
        s.setLong(id, "SocketConnectPort", port);
        s.setLong(id, "HeartBtInt", hb);
        s.setString(id, "StartTime", "00:00:00");
        s.setString(id, "EndTime", "00:00:00");
        s.setLong(id, "ReconnectInterval", 1);
        s.setString(id, "FileStorePath", store + "/" + comp);
        s.setString(id, "UseDataDictionary", "Y");
        s.setString(id, "DataDictionary", "FIX44.xml");
        s.setString(id, "ResetOnLogon", "N");
        s.setString(id, "ResetOnLogout", "N");
        s.setString(id, "ResetOnDisconnect", "N");
        if (trustStore != null) {
            s.setString(id, "SocketUseSSL", "Y");
            s.setString(id, "SocketTrustStore", trustStore);
            s.setString(id, "SocketTrustStorePassword", "changeit");
        }
        SocketInitiator init = new SocketInitiator(peer, new FileStoreFactory(s), s,
                new SLF4JLogFactory(s), new DefaultMessageFactory());
        init.start();
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (!peer.loggedOn) {
            if (System.currentTimeMillis() > deadline) throw new IllegalStateException(comp + " did not log on");
            Thread.sleep(20);
        }
        return init;
    }

    static NewOrderSingle order(String id, char side, double qty, double px) {
        NewOrderSingle o = new NewOrderSingle(new ClOrdID(id), new Side(side), new TransactTime(), new OrdType(OrdType.LIMIT));
        o.set(new Symbol("SBER"));
        o.set(new OrderQty(qty));
        o.set(new Price(px));
        o.set(new TimeInForce(TimeInForce.DAY));
        return o;
    }

    public static void main(String[] args) throws Exception {
        String host = args[0];
        int port = Integer.parseInt(args[1]);
        String store = args[2];
        if (args.length >= 5) {
            trustStore = args[3];
            logonPassword = args[4];
        }
        SessionID qa = new SessionID("FIX.4.4", "QA", "BOURSE");
        SessionID qb = new SessionID("FIX.4.4", "QB", "BOURSE");
        Peer a = new Peer();
        Peer b = new Peer();
        SocketInitiator initA = start(a, "QA", host, port, store, 30);
        SocketInitiator initB = start(b, "QB", host, port, store, 1);
        check(true, "logon QA and QB");

        // A trade between the two sessions.
        Session.sendToTarget(order("A1", Side.SELL, 100, 100.00), qa);
        a.await("A1 new", exec("A1", "0"));
        Session.sendToTarget(order("B1", Side.BUY, 40, 100.00), qb);
        b.await("B1 new", exec("B1", "0"));
        Message fb = b.await("B1 fill", exec("B1", "F"));
        check(str(fb, 39).equals("2") && str(fb, 14).equals("40"), "QB filled 40 at " + str(fb, 31));
        Message fa = a.await("A1 fill", exec("A1", "F"));
        check(str(fa, 39).equals("1") && str(fa, 151).equals("60"), "QA partially filled, leaves 60");

        // Order status: ExecType=I with the order's state; an unknown order gets OrdStatus=8.
        OrderStatusRequest h = new OrderStatusRequest(new ClOrdID("A1"), new Side(Side.SELL));
        h.set(new Symbol("SBER"));
        Session.sendToTarget(h, qa);
        Message st = a.await("A1 status", exec("A1", "I"));
        check(str(st, 39).equals("1") && str(st, 14).equals("40") && str(st, 151).equals("60"),
                "status of A1: partially filled, cum 40, leaves 60, avg " + str(st, 6));
        OrderStatusRequest h2 = new OrderStatusRequest(new ClOrdID("NOPE"), new Side(Side.BUY));
        h2.set(new Symbol("SBER"));
        Session.sendToTarget(h2, qa);
        Message unk = a.await("NOPE status", exec("NOPE", "I"));
        check(str(unk, 39).equals("8") && str(unk, 103).equals("5"), "status of an unknown order: rejected, unknown order");

        // Replace, then cancel.
        OrderCancelReplaceRequest g = new OrderCancelReplaceRequest(new OrigClOrdID("A1"), new ClOrdID("A2"),
                new Side(Side.SELL), new TransactTime(), new OrdType(OrdType.LIMIT));
        g.set(new Symbol("SBER"));
        g.set(new OrderQty(80));
        g.set(new Price(100.50));
        Session.sendToTarget(g, qa);
        Message rep = a.await("A2 replaced", exec("A2", "5"));
        check(str(rep, 41).equals("A1") && str(rep, 151).equals("40"), "replace A1 -> A2, leaves 40");
        OrderCancelRequest f = new OrderCancelRequest(new OrigClOrdID("A2"), new ClOrdID("C1"), new Side(Side.SELL), new TransactTime());
        f.set(new Symbol("SBER"));
        Session.sendToTarget(f, qa);
        Message can = a.await("C1 cancelled", exec("C1", "4"));
        check(str(can, 41).equals("A2") && str(can, 39).equals("4"), "cancel A2");

        // Mass cancel.
        Session.sendToTarget(order("A3", Side.BUY, 10, 99.00), qa);
        Session.sendToTarget(order("A4", Side.BUY, 10, 98.00), qa);
        a.await("A3 new", exec("A3", "0"));
        a.await("A4 new", exec("A4", "0"));
        OrderMassCancelRequest q = new OrderMassCancelRequest(new ClOrdID("M1"),
                new MassCancelRequestType(MassCancelRequestType.CANCEL_ALL_ORDERS), new TransactTime());
        Session.sendToTarget(q, qa);
        Message r = a.await("mass cancel report", m -> type(m).equals("r") && str(m, 11).equals("M1"));
        check(str(r, 533).equals("2") && str(r, 531).equals("7"), "mass cancel took 2 orders");
        a.await("A3 cancelled", m -> type(m).equals("8") && str(m, 41).equals("A3") && str(m, 150).equals("4"));
        a.await("A4 cancelled", m -> type(m).equals("8") && str(m, 41).equals("A4") && str(m, 150).equals("4"));

        // Insufficient collateral.
        Session.sendToTarget(order("A9", Side.BUY, 1_000_000_000, 100.00), qa);
        Message rej = a.await("A9 rejected", exec("A9", "8"));
        check(str(rej, 103).equals("3") && str(rej, 58).contains("InsufficientCollateral"),
                "reject for insufficient collateral: " + str(rej, 58));

        // A forced sequence gap: the gateway asks for a resend, QuickFIX/J gap-fills.
        Session sa = Session.lookupSession(qa);
        sa.setNextSenderMsgSeqNum(sa.getStore().getNextSenderMsgSeqNum() + 5);
        Session.sendToTarget(order("A5", Side.BUY, 10, 97.00), qa);
        a.await("A5 new after the gap", exec("A5", "0"));
        check(a.awaitAdmin(m -> type(m).equals("2"), 1000), "gateway sent a ResendRequest for the gap");

        // HeartBtInt=1: heartbeats flow, and a TestRequest is answered.
        Session.sendToTarget(new TestRequest(new TestReqID("T1")), qb);
        check(b.awaitAdmin(m -> type(m).equals("0") && str(m, 112).equals("T1"), 3000), "TestRequest T1 answered");
        Thread.sleep(2500);
        check(b.awaitAdmin(m -> type(m).equals("0") && str(m, 112).isEmpty(), 100), "gateway heartbeats at 1 s");

        // Logout QA; QB trades against QA's resting A5; QA restarts from its store.
        initA.stop();
        a.loggedOn = false;
        Session.sendToTarget(order("B2", Side.SELL, 10, 97.00), qb);
        b.await("B2 fill", exec("B2", "F"));
        Peer a2 = new Peer();
        SocketInitiator initA2 = start(a2, "QA", host, port, store, 30);
        Message late = a2.await("A5 fill after reconnect", exec("A5", "F"));
        check(str(late, 39).equals("2"), "fill sent while QA was away arrives once after logon");
        Thread.sleep(1500);
        List<String> ids = new ArrayList<>(a.execIds());
        ids.addAll(a2.execIds());
        check(new HashSet<>(ids).size() == ids.size(), "no duplicate execution report on QA (" + ids.size() + ")");
        long a5fills = a2.execIds().size();
        check(a5fills == 1, "exactly one report after reconnect (" + a5fills + ")");
        check(new HashSet<>(b.execIds()).size() == b.execIds().size(), "no duplicate execution report on QB");

        initA2.stop();
        initB.stop();
        System.out.println("ALL OK");
        System.exit(0);
    }
}
